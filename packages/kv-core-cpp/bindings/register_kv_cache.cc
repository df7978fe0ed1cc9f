// KVCache: state checks first, then arguments (arguments.h; as kv_core_py), then kvcore::KVCache
// without the GIL (but a decode step's: keeps_gil).
#include <nanobind/stl/string.h>

#include <algorithm>
#include <optional>

#include "arguments.h"
#include "kvcore/cache_context.h"
#include "kvcore/constants.h"
#include "kvcore/kv_cache.h"
#include "kvcore/poison.h"
#include "py_objects.h"
#include "python_api.h"
#include "register.h"
#include "token_input.h"

namespace kvcore::py {

PyKVCache::~PyKVCache() {
  // Closing takes the manager's lock, which a thread waiting for the GIL may hold: close
  // without the GIL, then destroy the (closed) cache with it.
  // Poisoned, close() would throw: the core's destructor then drops the cache as it is.
  if (cache && cache->status() != CacheStatus::kClosed && !cache->context().is_shut_down && !poison::reason()) {
    nb::gil_scoped_release release;
    try {
      cache->close_dropped();
    } catch (...) {  // poisoned meanwhile (or on the way): never throw from a destructor
    }
  }
  cache.reset();
  for (auto& [group, view] : buffers) PyBuffer_Release(&view);
}

namespace {

nb::object status_object(CacheStatus s) { return api("KVCacheStatus")(static_cast<int>(s)); }

// kv_api.stats.ReuseReport (None with reuse_report off).
nb::object reuse_report_object(const std::optional<ReuseReport>& report) {
  if (!report) return nb::none();
  nb::list levels;
  for (std::int64_t n : report->reused_tokens_by_level) levels.append(n);
  // Blocks evicted together share one (frozen, equal) record: a long prompt has thousands, and a
  // dataclass made each costs a microsecond. Filled in place: the replay reads one per admission.
  const std::size_t n = report->evicted_blocks.size();
  nb::object evicted = nb::steal(PyTuple_New(static_cast<Py_ssize_t>(n)));
  if (!evicted.is_valid()) throw nb::python_error();
  nb::object last;
  const EvictedBlock* last_block = nullptr;
  for (std::size_t i = 0; i < n; ++i) {
    const EvictedBlock& b = report->evicted_blocks[i];
    if (last_block == nullptr || b.level != last_block->level || b.age != last_block->age) {
      last = kv_api().evicted_block(b.level, b.age);
      last_block = &b;
    }
    PyTuple_SET_ITEM(evicted.ptr(), static_cast<Py_ssize_t>(i), last.inc_ref().ptr());  // steals the reference
  }
  return kv_api().reuse_report(report->num_prompt_tokens, nb::tuple(levels), report->miss_stale_tokens,
                               report->miss_capped_tokens, report->miss_evicted_tokens, report->miss_partial_tokens,
                               report->miss_never_seen_tokens, report->miss_other_scope_tokens, evicted);
}

nb::object int_array(const std::vector<std::int32_t>& values) {
  nb::object array = nb::module_::import_("array").attr("array")("i");
  array.attr("frombytes")(
      nb::bytes(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(std::int32_t)));
  return array;
}

int group_arg(PyKVCache& self, nb::handle layer_group, nb::handle beam) {
  const auto group =
      arg::index_below("layer_group", layer_group, static_cast<std::size_t>(self.cache->num_layer_groups()));
  arg::beam(beam);
  return static_cast<int>(group);
}

// Tokens a resize or commit may add and still run holding the GIL (keeps_gil).
constexpr std::int64_t kGilHeldTokens = 64;

// Whether a resize or commit adding `new_tokens` runs holding the GIL: a decode step's (a few
// tokens) on a manager whose pages never move (one cache level, no page copier) is bookkeeping of
// about a microsecond or less (an SSM layer's state snapshot copied within the level at most),
// where handing the GIL over and taking it back costs ~40 ns a call, a sixth of a step
// (docs/manager.md, "Threads and the GIL"); anything that may hash many tokens or move page bytes
// lets other threads run. With a remote tier a commit that `fills_block` writes it through (its
// pages copied and checksummed, megabytes for a large model), so only the others keep it.
bool keeps_gil(const PyKVCache& self, std::int64_t new_tokens, bool fills_block = false) {
  const PyManager& owner = nb::cast<const PyManager&>(self.manager);
  return new_tokens <= kGilHeldTokens && owner.manager->config().cache_tiers.size() == 1 && owner.copier == nullptr &&
         (owner.block_store == nullptr || !fills_block);
}

bool resize(PyKVCache& self, nb::handle capacity_arg, nb::handle history_length_arg) {
  const ManagerLock lock(self.cache->context());
  self.cache->require(CacheStatus::kActive, "resize");
  const auto capacity = arg::optional_count("capacity", capacity_arg, kTokenLimit);
  const auto history = arg::optional_count("history_length", history_length_arg, kTokenLimit);
  std::optional<nb::gil_scoped_release> release;
  if (!keeps_gil(self, capacity.value_or(0) - self.cache->capacity())) release.emplace();
  return self.cache->resize(capacity, history);
}

// The `capacity` and `history_length` setters: resize with one length, an int. None is refused
// (after the state check, as resize orders them), since resize would take it as "unchanged" and an
// assignment of None would silently do nothing.
void set_length(PyKVCache& self, const char* name, nb::handle value, bool is_capacity) {
  const ManagerLock lock(self.cache->context());  // recursive: resize takes it again
  self.cache->require(CacheStatus::kActive, "resize");
  if (value.is_none()) fail(PyExc_TypeError, msg::kExpectedInt, {name, py_type_name(value)});
  if (is_capacity) self.cache->require_capacity_settable();
  if (!(is_capacity ? resize(self, value, nb::none()) : resize(self, nb::none(), value))) {
    fail(kv_api().errors.attr("OutOfPagesError").ptr(), msg::kNotEnoughPages, {name});
  }
}

void commit(PyKVCache& self, nb::handle tokens, nb::handle is_end) {
  const ManagerLock lock(self.cache->context());
  self.cache->require(CacheStatus::kActive, "commit");
  self.cache->require_commit_allowed();
  // Viewed in place (a buffer) or packed once (a list), as commit_many reads its tokens: the
  // cache's own token list is the one copy. The view is released after the GIL is taken back.
  const TokenInput input(tokens, nb::cast<PyManager&>(self.manager).manager->config().key_format);
  const bool end = arg::truthy(is_end);
  const std::size_t count = input.tokens().count;
  std::optional<nb::gil_scoped_release> release;
  if (!keeps_gil(self, static_cast<std::int64_t>(count), end || self.cache->fills_block(count))) release.emplace();
  self.cache->commit(input.tokens(), 0, input.tokens().count, end);
}

void set_buffer(PyKVCache& self, nb::handle beam, nb::handle layer_group, nb::handle buf) {
  // Held to the end: the exported view must change with the core's buffer, or a racing call could
  // release the view the core still writes through.
  const ManagerLock lock(self.cache->context());
  const int group = group_arg(self, layer_group, beam);
  if (buf.is_none()) {
    {
      nb::gil_scoped_release release;
      self.cache->set_base_page_index_buf(group, IndexBuffer{});
    }
    auto it = self.buffers.find(group);
    if (it != self.buffers.end()) {
      PyBuffer_Release(&it->second);
      self.buffers.erase(it);
    }
    return;
  }
  Py_buffer view = arg::index_buffer(buf);
  try {
    nb::gil_scoped_release release;
    self.cache->set_base_page_index_buf(
        group, IndexBuffer{static_cast<std::int32_t*>(view.buf), static_cast<std::size_t>(view.shape[0])});
  } catch (...) {
    PyBuffer_Release(&view);
    throw;
  }
  auto it = self.buffers.find(group);
  if (it != self.buffers.end()) PyBuffer_Release(&it->second);
  self.buffers[group] = view;
}

template <typename F>
auto unlocked(F&& f) {
  nb::gil_scoped_release release;
  return f();
}

// A property read under the manager's lock (another thread may be changing the cache).
template <typename F>
auto getter(F f) {
  return [f](PyKVCache& self) {
    const ManagerLock lock(self.cache->context());
    return f(*self.cache);
  };
}

// Lengths, state and the request's statistics.
void define_state(nb::class_<PyKVCache>& cls) {
  // Two reads without the lock, so they check the poison latch themselves (the lock checks it
  // for every other call).
  cls.def_prop_ro("manager",
                  [](PyKVCache& self) {
                    poison::check();
                    return self.manager;
                  })
      .def_prop_ro("id", getter([](const KVCache& c) { return c.id(); }))
      .def_prop_ro("status", getter([](const KVCache& c) { return status_object(c.status()); }))
      .def_prop_ro("is_active", getter([](const KVCache& c) { return c.status() == CacheStatus::kActive; }))
      .def_prop_ro("tokens_per_block", getter([](const KVCache& c) { return c.tokens_per_block(); }))
      .def_prop_ro("beam_width",
                   [](PyKVCache&) {
                     poison::check();
                     return 1;
                   })
      .def_prop_ro("reuse_scope", getter([](const KVCache& c) { return scope_object(c.reuse_scope()); }))
      .def_prop_ro("num_committed_tokens", getter([](const KVCache& c) { return c.num_committed_tokens(); }))
      .def_prop_ro("committed_tokens", getter([](const KVCache& c) { return token_objects(c.committed_tokens()); }))
      .def_prop_ro("num_reused_tokens", getter([](const KVCache& c) { return c.num_reused_tokens(); }))
      .def_prop_ro("num_blocks", getter([](const KVCache& c) { return c.num_blocks(); }))
      .def_prop_ro("expected_prompt_length", getter([](const KVCache& c) { return c.stats.expected_prompt_length(); }))
      .def_prop_ro("text_only", getter([](const KVCache& c) { return c.stats.text_only(); }))
      .def("commit_pending_stats",
           [](PyKVCache& self) {
             const ManagerLock lock(self.cache->context());
             const KVCacheStatsDelta d = self.cache->stats.commit();
             return api("stats.KVCacheStatsDelta")(d.lookup_tokens, d.reused_tokens, d.allocated_pages,
                                                   d.generation_allocated_pages, d.committed_blocks);
           })
      .def("discard_pending_stats", [](PyKVCache& self) {
        const ManagerLock lock(self.cache->context());
        self.cache->stats.discard();
      });
}

// The lengths' setters, the state machine and committing.
void define_state_machine(nb::class_<PyKVCache>& cls) {
  // The setters' values, like every argument, are declared .none(): nanobind would refuse None
  // with its own TypeError before the state is checked.
  cls.def_prop_rw(
         "history_length", getter([](const KVCache& c) { return c.history_length(); }),
         [](PyKVCache& self, nb::handle value) { set_length(self, "history_length", value, false); },
         nb::for_setter(nb::arg("value").none()))
      .def_prop_rw(
          "capacity", getter([](const KVCache& c) { return c.capacity(); }),
          [](PyKVCache& self, nb::handle value) { set_length(self, "capacity", value, true); },
          nb::for_setter(nb::arg("value").none()))
      .def(
          "resume", [](PyKVCache& self, nb::handle) { return unlocked([&] { return self.cache->resume(); }); },
          nb::arg("stream").none() = nb::none())
      .def(
          "prefetch",
          [](PyKVCache& self, nb::handle target_level) {
            const ManagerLock lock(self.cache->context());
            self.cache->require(CacheStatus::kSuspended, "prefetch");
            const int level =
                arg::cache_level(target_level, self.cache->context().storage().num_levels(), "target_level");
            return unlocked([&] { return self.cache->prefetch(level); });
          },
          nb::arg("target_level").none() = 0)
      .def_prop_ro("cached_tokens_by_level", getter([](const KVCache& c) {
                     nb::list out;
                     for (std::int64_t n : c.cached_tokens_by_level()) out.append(n);
                     return out;
                   }))
      .def_prop_ro("reuse_report", getter([](const KVCache& c) { return reuse_report_object(c.reuse_report()); }))
      .def("suspend", [](PyKVCache& self) { unlocked([&] { self.cache->suspend(); }); })
      .def("resize", &resize, nb::arg("capacity").none() = nb::none(), nb::arg("history_length").none() = nb::none())
      .def("commit", &commit, nb::arg("tokens").none(), nb::arg("is_end").none() = false)
      .def("stop_committing", [](PyKVCache& self) { unlocked([&] { self.cache->stop_committing(); }); })
      .def("close", [](PyKVCache& self) { unlocked([&] { self.cache->close(); }); })
      .def("plan_committed_block_drop", [](PyKVCache& self) -> nb::object {
        std::unique_ptr<PlannedDropHandle> plan = unlocked([&] { return self.cache->plan_committed_block_drop(); });
        if (!plan) return nb::none();
        return nb::cast(new PyPlannedDropHandle{self.manager, std::move(plan)}, nb::rv_policy::take_ownership);
      });
}

// Page indices and the caller's index buffers.
void define_page_indices(nb::class_<PyKVCache>& cls) {
  cls.def(
         "get_base_page_indices",
         [](PyKVCache& self, nb::handle layer_group, nb::handle beam) {
           const ManagerLock lock(self.cache->context());
           const int group = group_arg(self, layer_group, beam);
           return int_array(unlocked([&] { return self.cache->get_base_page_indices(group); }));
         },
         nb::arg("layer_group").none(), nb::arg("beam").none() = 0)
      .def(
          "get_ssm_block_base_index",
          [](PyKVCache& self, nb::handle layer_group) {
            const ManagerLock lock(self.cache->context());
            const int group = group_arg(self, layer_group, nb::int_(0));
            return unlocked([&] { return self.cache->get_ssm_block_base_index(group); });
          },
          nb::arg("layer_group").none())
      .def(
          "get_page_levels",
          [](PyKVCache& self, nb::handle layer_group, nb::handle beam) {
            const ManagerLock lock(self.cache->context());
            const int group = group_arg(self, layer_group, beam);
            return int_array(unlocked([&] { return self.cache->get_page_levels(group); }));
          },
          nb::arg("layer_group").none(), nb::arg("beam").none() = 0)
      .def(
          "get_aggregated_page_indices",
          [](PyKVCache& self, nb::handle layer_group, nb::handle beam, nb::handle valid_only) {
            const ManagerLock lock(self.cache->context());
            const int group = group_arg(self, layer_group, beam);
            std::vector<std::int32_t> idx = unlocked([&] { return self.cache->get_base_page_indices(group); });
            if (arg::truthy(valid_only)) idx.erase(std::remove(idx.begin(), idx.end(), kBadPageIndex), idx.end());
            return int_array(idx);
          },
          nb::arg("layer_group").none(), nb::arg("beam").none() = 0, nb::arg("valid_only").none() = false)
      .def("set_base_page_index_buf", &set_buffer, nb::arg("beam").none(), nb::arg("layer_group").none(),
           nb::arg("buf").none());
}

// Sliding-window scratch.
void define_scratch(nb::class_<PyKVCache>& cls) {
  cls.def_prop_rw(
         "enable_swa_scratch_reuse", getter([](const KVCache& c) { return c.enable_swa_scratch_reuse(); }),
         [](PyKVCache& self, nb::handle value) {
           const ManagerLock lock(self.cache->context());
           if (!PyBool_Check(value.ptr())) {
             fail(PyExc_TypeError, msg::kExpectedBool, {"enable_swa_scratch_reuse", py_type_name(value)});
           }
           self.cache->set_enable_swa_scratch_reuse(nb::cast<bool>(value));
         },
         nb::for_setter(nb::arg("value").none()))
      .def_prop_ro("has_scratch_slots", getter([](const KVCache& c) { return c.has_scratch_slots(); }))
      .def(
          "get_scratch_desc",
          [](PyKVCache& self, nb::handle layer_group) -> nb::object {
            const ManagerLock lock(self.cache->context());
            const int group = group_arg(self, layer_group, nb::int_(0));
            const auto desc = self.cache->get_scratch_desc(group);
            if (!desc) return nb::none();
            nb::list slots;
            for (std::int32_t s : desc->second) slots.append(s);
            const nb::object range = nb::module_::import_("builtins").attr("range");
            return api("ScratchDesc")(range(desc->first.first, desc->first.second), nb::tuple(slots));
          },
          nb::arg("layer_group").none())
      .def(
          "supports_index_mode",
          [](PyKVCache& self, nb::handle mode) {
            const ManagerLock lock(self.cache->context());
            return !arg::shared_index_mode(mode) || !self.cache->has_scratch_slots();
          },
          nb::arg("mode").none());
}

}  // namespace

void register_kv_cache(nb::module_& m) {
  nb::class_<PyKVCache> cls(m, "KVCache");
  define_state(cls);
  define_state_machine(cls);
  define_page_indices(cls);
  define_scratch(cls);
}

}  // namespace kvcore::py
