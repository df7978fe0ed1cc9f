// KVCacheManager's reuse: create_kv_cache and the reuse probes, added to the class
// register_manager() made (the core's manager_reuse.cc; kv_core_py's manager_reuse.py).
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>

#include "arguments.h"
#include "kvcore/constants.h"
#include "kvcore/manager.h"
#include "py_objects.h"
#include "python_api.h"
#include "register.h"
#include "token_input.h"

namespace kvcore::py {

namespace {

// The caller's tokens, viewed in place (None is no tokens); destroy it with the GIL held.
std::unique_ptr<TokenInput> tokens_arg(PyManager& self, nb::handle tokens) {
  return std::make_unique<TokenInput>(tokens.is_none() ? nb::tuple() : nb::borrow(tokens),
                                      self.manager->config().key_format);
}

}  // namespace

// The core keeps callbacks without the GIL, so the closure holds only borrowed pointers: the
// callable is owned by the PyKVCache (and by the call's arguments while it is created), the
// life-cycle objects by the PyManager.
PriorityCallback priority_callback(nb::handle callback, PyManager& self) {
  if (callback.is_none()) return {};
  PyObject* fn = callback.ptr();
  PyObject* life_cycles = self.life_cycles.ptr();
  return [fn, life_cycles](std::int64_t ordinal, int layer_group) -> int {
    nb::gil_scoped_acquire acquire;
    return arg::priority(nb::handle(fn)(ordinal, nb::handle(PyTuple_GET_ITEM(life_cycles, layer_group))));
  };
}

namespace {

nb::object create_kv_cache(nb::handle self_handle, nb::handle reuse_scope_arg, nb::handle input_tokens, nb::handle id,
                           nb::handle callback, nb::handle expected_prompt_length, nb::handle text_only,
                           nb::handle enable_request_stats, nb::handle max_reused_tokens) {
  PyManager& self = nb::cast<PyManager&>(self_handle);
  const ManagerLock lock(self.manager->context());
  self.manager->require_live();
  arg::callable_or_none(callback);
  const ReuseScope scope = arg::reuse_scope(reuse_scope_arg);
  const auto input = tokens_arg(self, input_tokens);
  const std::optional<std::int64_t> cache_id = arg::optional_count("id", id, kCacheIdLimit);
  const std::optional<std::int64_t> expected =
      arg::optional_count("expected_prompt_length", expected_prompt_length, kTokenLimit);
  const std::optional<bool> text = arg::optional_bool("text_only", text_only);
  const bool request_stats = arg::strict_bool("enable_request_stats", enable_request_stats);
  const std::optional<std::int64_t> max_reused =
      arg::optional_count("max_reused_tokens", max_reused_tokens, kTokenLimit);
  PriorityCallback priority = priority_callback(callback, self);
  std::unique_ptr<KVCache> cache;
  {
    nb::gil_scoped_release release;
    cache = self.manager->create_kv_cache(scope, input->tokens(), cache_id, std::move(priority), expected, text,
                                          request_stats, max_reused);
  }
  auto* py_cache = new PyKVCache{nb::borrow(self_handle), nb::borrow(callback), std::move(cache), {}};
  return nb::cast(py_cache, nb::rv_policy::take_ownership);
}

// A probe's arguments, checked in kv_core_py's order; the caller holds the manager's lock (and
// the GIL when they are destroyed: the tokens' view).
struct ProbeArgs {
  ReuseScope scope;
  std::unique_ptr<TokenInput> input;
  std::optional<std::int64_t> max_reused;
};

ProbeArgs probe_args(PyManager& self, nb::handle reuse_scope_arg, nb::handle tokens, nb::handle max_reused_tokens) {
  self.manager->require_live();
  ProbeArgs a{arg::reuse_scope(reuse_scope_arg), nullptr, std::nullopt};
  a.input = tokens_arg(self, tokens);
  a.max_reused = arg::optional_count("max_reused_tokens", max_reused_tokens, kTokenLimit);
  return a;
}

std::int64_t probe_reuse(PyManager& self, nb::handle reuse_scope_arg, nb::handle tokens, nb::handle max_reused_tokens) {
  const ManagerLock lock(self.manager->context());
  const ProbeArgs a = probe_args(self, reuse_scope_arg, tokens, max_reused_tokens);
  nb::gil_scoped_release release;
  return self.manager->probe_reuse(a.scope, a.input->tokens(), a.max_reused);
}

nb::object probe_first_new_block_key(PyManager& self, nb::handle reuse_scope_arg, nb::handle tokens,
                                     nb::handle max_reused_tokens) {
  const ManagerLock lock(self.manager->context());
  const ProbeArgs a = probe_args(self, reuse_scope_arg, tokens, max_reused_tokens);
  std::optional<Digest> key;
  {
    nb::gil_scoped_release release;
    key = self.manager->probe_first_new_block_key(a.scope, a.input->tokens(), a.max_reused);
  }
  if (!key) return nb::none();
  return nb::bytes(reinterpret_cast<const char*>(key->data()), key->size());
}

nb::object probe_reuse_match(PyManager& self, nb::handle reuse_scope_arg, nb::handle tokens,
                             nb::handle max_reused_tokens) {
  const ManagerLock lock(self.manager->context());
  const ProbeArgs a = probe_args(self, reuse_scope_arg, tokens, max_reused_tokens);
  KVCacheManager::ReuseMatch m{};
  {
    nb::gil_scoped_release release;
    m = self.manager->probe_reuse_match(a.scope, a.input->tokens(), a.max_reused);
  }
  return api("stats.ReuseMatch")(m.num_lookup_tokens, m.num_divergence_tokens, m.num_attention_tokens,
                                 m.num_reused_tokens);
}

}  // namespace

// Every argument is declared .none(), as register_manager's (arguments.h checks None).
void register_manager_reuse(nb::module_& m) {
  nb::handle cls = m.attr("KVCacheManager");
  nb::cpp_function_def(&probe_reuse_match, nb::scope(cls), nb::name("probe_reuse_match"), nb::is_method(),
                       nb::arg("reuse_scope").none() = nb::none(), nb::arg("tokens").none() = nb::none(),
                       nb::arg("max_reused_tokens").none() = nb::none());
  nb::cpp_function_def(&probe_reuse, nb::scope(cls), nb::name("probe_reuse"), nb::is_method(),
                       nb::arg("reuse_scope").none() = nb::none(), nb::arg("tokens").none() = nb::none(),
                       nb::arg("max_reused_tokens").none() = nb::none());
  nb::cpp_function_def(&probe_first_new_block_key, nb::scope(cls), nb::name("probe_first_new_block_key"),
                       nb::is_method(), nb::arg("reuse_scope").none(), nb::arg("tokens").none(),
                       nb::arg("max_reused_tokens").none() = nb::none());
  nb::cpp_function_def(&create_kv_cache, nb::scope(cls), nb::name("create_kv_cache"), nb::is_method(),
                       nb::arg("reuse_scope").none() = nb::none(), nb::arg("input_tokens").none() = nb::none(),
                       nb::arg("id").none() = nb::none(), nb::arg("custom_priority_callback").none() = nb::none(),
                       nb::arg("expected_prompt_length").none() = nb::none(), nb::arg("text_only").none() = nb::none(),
                       nb::arg("enable_request_stats").none() = false,
                       nb::arg("max_reused_tokens").none() = nb::none());
}

}  // namespace kvcore::py
