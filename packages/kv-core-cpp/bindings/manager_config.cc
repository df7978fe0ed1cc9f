// Reading a kv_api.KVCacheManagerConfig (validated by kv_api when it was built) into the core's
// plain KVCacheManagerConfig.
#include "manager_config.h"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>

#include "python_api.h"

namespace kvcore::py {

namespace nb = nanobind;

namespace {

std::optional<std::int64_t> int_or_none(nb::handle v) {
  if (v.is_none()) return std::nullopt;
  return nb::cast<std::int64_t>(v);
}

BatchDesc batch_desc(nb::handle b) {
  BatchDesc out;
  for (nb::handle d : b.attr("kv_caches")) {
    out.kv_caches.push_back(
        {nb::cast<std::int64_t>(d.attr("capacity")), nb::cast<std::int64_t>(d.attr("history_length"))});
  }
  out.system_prompt_length = nb::cast<std::int64_t>(b.attr("system_prompt_length"));
  return out;
}

}  // namespace

// kv_api validated the config when it was built, so its fields are read as they are.
KVCacheManagerConfig manager_config(nb::handle c) {
  KVCacheManagerConfig out;
  out.tokens_per_block = nb::cast<std::int64_t>(c.attr("tokens_per_block"));
  nb::object remote = c.attr("remote_tier");
  if (!remote.is_none()) {
    // kv_api computes what names the values, so that both backends' are byte-identical.
    const auto bytes = [](nb::handle b) {
      const nb::bytes v = nb::borrow<nb::bytes>(b);
      return std::string(v.c_str(), v.size());
    };
    out.remote_tier =
        RemoteTierConfig{bytes(api("block_value.store_namespace")(remote.attr("model_id"), remote.attr("revision"), c)),
                         bytes(api("block_value.layout_fingerprint")(c))};
  }
  for (nb::handle tier : c.attr("local_tiers")) {
    CacheTierConfig t;
    t.tier = static_cast<CacheTier>(nb::cast<int>(tier.attr("tier")));
    t.quota = nb::cast<std::uint64_t>(tier.attr("quota"));
    if (t.tier == CacheTier::kDisk) t.path = nb::cast<std::string>(tier.attr("path"));
    out.cache_tiers.push_back(std::move(t));
  }
  nb::object ssm = api("SsmLayerConfig");
  for (nb::handle layer : c.attr("layers")) {
    LayerConfig l;
    l.layer_id = nb::cast<std::int64_t>(layer.attr("layer_id"));
    l.ssm = nb::isinstance(layer, ssm);
    for (nb::handle b : layer.attr("buffers")) {
      nb::object tokens_per_block_override = b.attr("tokens_per_block_override");
      l.buffers.push_back({nb::cast<std::string>(b.attr("role")), nb::cast<std::uint64_t>(b.attr("size")),
                           tokens_per_block_override.is_none()
                               ? std::nullopt
                               : std::optional<std::uint64_t>(nb::cast<std::uint64_t>(tokens_per_block_override))});
    }
    if (!l.ssm) {
      l.sliding_window_size = int_or_none(layer.attr("sliding_window_size"));
      l.num_sink_tokens = int_or_none(layer.attr("num_sink_tokens"));
    }
    out.layers.push_back(std::move(l));
  }
  out.max_util_for_resume = nb::cast<double>(c.attr("max_util_for_resume"));
  out.enable_partial_reuse = nb::cast<bool>(c.attr("enable_partial_reuse"));
  out.populate_memory = nb::cast<bool>(c.attr("populate_memory"));
  out.reuse_report = nb::cast<bool>(c.attr("reuse_report"));
  out.ghost_record_blocks = nb::cast<std::int64_t>(c.attr("ghost_record_blocks"));
  out.reuse_report_other_scope = nb::cast<bool>(c.attr("reuse_report_other_scope"));
  out.reuse_match_backoff = nb::cast<std::int64_t>(c.attr("reuse_match_backoff"));
  for (nb::handle b : c.attr("constraints")) out.constraints.push_back(batch_desc(b));
  nb::object typical = c.attr("typical_step");
  if (!typical.is_none()) out.typical_step = batch_desc(typical);
  nb::object ratio = c.attr("initial_pool_ratio");
  if (!ratio.is_none()) out.initial_pool_ratio = nb::cast<std::vector<double>>(ratio);
  out.commit_min_snapshot = nb::cast<bool>(c.attr("commit_min_snapshot"));
  out.text_only = nb::cast<bool>(c.attr("text_only"));
  nb::object scratch = c.attr("swa_scratch_reuse");
  if (!scratch.is_none())
    out.swa_scratch_reuse = SwaScratchReuseConfig{nb::cast<std::int64_t>(scratch.attr("max_rewind_len"))};
  out.key_format = parse_key_format(nb::cast<std::string>(c.attr("key_format")));
  out.rebalance_min_sampled_kv_caches = nb::cast<std::uint64_t>(c.attr("rebalance_min_sampled_kv_caches"));
  out.rebalance_cooldown_secs = nb::cast<double>(c.attr("rebalance_cooldown_secs"));
  out.rebalance_target_ratio_update_interval =
      nb::cast<std::uint64_t>(c.attr("rebalance_target_ratio_update_interval"));
  out.rebalance_ratio_threshold = nb::cast<double>(c.attr("rebalance_ratio_threshold"));
  out.rebalance_moving_average_decay = nb::cast<double>(c.attr("rebalance_moving_average_decay"));
  return out;
}

}  // namespace kvcore::py
