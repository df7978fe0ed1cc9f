// KVCacheManager: reads the kv_api config, checks arguments (arguments.h) in kv_core_py's
// order, and calls kvcore::KVCacheManager without the GIL.
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>

#include "arguments.h"
#include "kvcore/constants.h"
#include "kvcore/error.h"
#include "kvcore/manager.h"
#include "kvcore/poison.h"
#include "manager_config.h"
#include "py_objects.h"
#include "python_api.h"
#include "register.h"
#include "token_input.h"

namespace kvcore::py {

namespace {

nb::tuple life_cycle_objects(const KVCacheManager& manager) {
  nb::list out;
  for (const LifeCycle& life : manager.registry().life_cycles()) {
    out.append(api("LifeCycle")(life.id, optional_int(life.window), life.num_sink_blocks,
                                manager.registry().tokens_per_block(), life.ssm));
  }
  return nb::tuple(out);
}

void init(PyManager* self, nb::handle config, nb::handle event_manager, nb::handle page_copier) {
  poison::check();  // before the arguments, as every call orders it
  arg::manager_config(config);
  KVCacheEventManager* events = arg::event_manager(event_manager);
  arg::page_copier(page_copier);
  const KVCacheManagerConfig c = manager_config(config);
  // The default copier is memmove in the core: no Python call per batch (as kv_core_py).
  const bool own_copies = page_copier.is_none() || page_copier.type().is(api("HostMemoryCopier"));
  auto copier = own_copies ? nullptr : std::make_unique<PyPageCopier>(page_copier);
  nb::object remote = config.attr("remote_tier");
  nb::object store = remote.is_none() ? nb::none() : remote.attr("store");
  auto block_store = store.is_none() ? nullptr : std::make_unique<PyBlockStore>(store);
  std::unique_ptr<KVCacheManager> manager;
  {
    nb::gil_scoped_release release;
    manager = std::make_unique<KVCacheManager>(c, events, copier.get(), block_store.get());
  }
  nb::tuple life_cycles = life_cycle_objects(*manager);
  new (self) PyManager{nb::borrow(config),
                       nb::borrow(event_manager),
                       nb::borrow(page_copier),
                       std::move(copier),
                       store,
                       std::move(block_store),
                       std::move(manager),
                       life_cycles};
}

// --- page copies -------------------------------------------------------------------------------

}  // namespace

void PyPageCopier::copy(int src_level, int dst_level, const std::vector<CopyRun>& runs) {
  nb::gil_scoped_acquire acquire;
  nb::list list;
  for (const CopyRun& r : runs) {
    list.append(nb::make_tuple(nb::steal(PyLong_FromUnsignedLongLong(r.src)),
                               nb::steal(PyLong_FromUnsignedLongLong(r.dst)),
                               nb::steal(PyLong_FromUnsignedLongLong(r.num_bytes))));
  }
  nb::handle(copier_).attr("copy")(src_level, dst_level, list);
}

namespace {

// --- layers --------------------------------------------------------------------------------

// The caller holds the manager's lock. Left to right, type before value (docs/errors.md): the
// layer id (an int, then a known layer), then the role (a str, then one of the layer's buffers).
const BufferPlacement& placement(PyManager& self, nb::handle layer_id, nb::handle role) {
  self.manager->require_live();
  const std::int64_t layer = arg::layer_id(layer_id);
  self.manager->registry().layer_group_of(layer);  // KeyError "no layer L"
  // A role that is no UTF-8 names no buffer: the same KeyError as any unknown role.
  const std::optional<std::string> name = arg::name("role", role);
  try {
    if (!name) fail(PyExc_KeyError, msg::kNoBuffer, {py_repr(role), std::to_string(layer)});
    return self.manager->storage_config().placement(layer, *name);
  } catch (const Error& e) {
    // The core quotes the role itself; the message shows Python's repr, as kv_core_py's does.
    if (e.kind() != ErrorKind::kKey) throw;
    fail(PyExc_KeyError, msg::kNoBuffer, {py_repr(role), std::to_string(layer)});
  }
}

// --- memory ----------------------------------------------------------------------------------

// A pool's bytes, exported through the buffer protocol; it keeps its manager alive.
struct PoolBuffer {
  nb::object owner;
  std::uint8_t* data;
  Py_ssize_t size;
};

int pool_getbuffer(PyObject* self, Py_buffer* view, int flags) {
  PoolBuffer* pb = nb::inst_ptr<PoolBuffer>(self);
  return PyBuffer_FillInfo(view, self, pb->data, pb->size, 0, flags);
}

PyType_Slot pool_buffer_slots[] = {{Py_bf_getbuffer, reinterpret_cast<void*>(pool_getbuffer)}, {0, nullptr}};

nb::object pool_memory(nb::handle self_handle, nb::handle pool_group, nb::handle pool) {
  PyManager& self = nb::cast<PyManager&>(self_handle);
  const ManagerLock lock(self.manager->context());
  self.manager->require_live();
  auto& groups = self.manager->storage().pool_groups();
  const std::uint64_t g = arg::index_below("pool_group", pool_group, groups.size());
  const std::uint64_t p = arg::index_below("pool", pool, groups[g].pools.size());
  const MemoryPool& mp = groups[g].pools[p];
  nb::object buffer = nb::cast(PoolBuffer{nb::borrow(self_handle), mp.data(), static_cast<Py_ssize_t>(mp.size())});
  return nb::steal(PyMemoryView_FromObject(buffer.ptr()));
}

// --- statistics ---------------------------------------------------------------------------------

std::int64_t cache_id_arg(nb::handle cache_id) { return arg::int_between("cache_id", cache_id, 0, kCacheIdLimit); }

nb::object stats_object(const CacheStats& s) {
  return api("stats.CacheStats")(
      s.requests, s.lookup_tokens, s.reused_tokens, s.allocated_pages, s.evicted_pages, s.committed_blocks,
      s.onboarded_pages, s.corrupt_pages, s.disk_full_events, s.remote_lookups, s.remote_blocks, s.remote_rejected,
      s.remote_written, s.remote_errors, s.remote_skipped, s.miss_stale_tokens, s.miss_capped_tokens,
      s.miss_evicted_tokens, s.miss_partial_tokens, s.miss_never_seen_tokens, s.miss_other_scope_tokens);
}

// One of the manager's statistics snapshots, taken without the GIL.
nb::object stats(PyManager& self, CacheStats (KVCacheManager::*take)()) {
  CacheStats s;
  {
    nb::gil_scoped_release release;
    s = (self.manager.get()->*take)();
  }
  return stats_object(s);
}

nb::list storage_statistics(PyManager& self, nb::handle level) {
  poison::check();  // before the level, which is checked before the core takes its lock
  const int l = arg::cache_level(level, self.manager->num_levels());
  std::vector<StorageStatistics> stats;
  {
    // A read of a few counters (once per engine step in a replay): the GIL is released only
    // if another thread holds the manager.
    const ManagerLock lock(self.manager->context());
    stats = self.manager->get_storage_statistics(l);
  }
  nb::list out;
  for (const StorageStatistics& s : stats) out.append(kv_api().storage_statistics(s.total, s.free, s.evictable));
  return out;
}

nb::list pool_group_descs(PyManager& self) {
  const ManagerLock lock(self.manager->context());
  self.manager->require_live();
  nb::list out;
  auto& groups = self.manager->storage().pool_groups();
  for (const PoolGroupConfig& pg : self.manager->storage_config().pool_groups()) {
    nb::list pools;
    for (const MemoryPool& pool : groups[pg.index].pools) {
      pools.append(api("PoolDesc")(reinterpret_cast<std::uintptr_t>(pool.data()), pool.slot_size()));
    }
    nb::list layer_groups;
    for (int group : pg.life_cycles) layer_groups.append(group);
    out.append(api("PoolGroupDesc")(pg.index, self.manager->counts().slots[pg.index], nb::tuple(layer_groups),
                                    nb::tuple(pools)));
  }
  return out;
}

// The config, its layers and layer groups.
void define_configuration(nb::class_<PyManager>& cls) {
  cls.def("__init__", &init, nb::arg("config").none(), nb::arg("event_manager").none() = nb::none(),
          nb::arg("page_copier").none() = nb::none())
      // The config and the layer registry are fixed when the manager is built: read without the
      // lock, so these check the poison latch themselves (the lock checks it for every other call).
      .def_prop_ro("init_config",
                   [](PyManager& self) {
                     poison::check();
                     return self.config;
                   })
      .def_prop_ro("tokens_per_block",
                   [](PyManager& self) {
                     poison::check();
                     return self.manager->tokens_per_block();
                   })
      .def_prop_ro("life_cycles",
                   [](PyManager& self) {
                     poison::check();
                     return nb::list(self.life_cycles);
                   })
      .def_prop_ro("layer_grouping",
                   [](PyManager& self) {
                     poison::check();
                     return self.manager->layer_grouping();
                   })
      .def_prop_ro("layer_ids",
                   [](PyManager& self) {
                     poison::check();
                     std::vector<std::int64_t> ids;
                     for (const auto& entry : self.manager->registry().layers()) ids.push_back(entry.first);
                     return ids;
                   })
      .def_prop_ro("num_layers",
                   [](PyManager& self) {
                     poison::check();
                     return self.manager->registry().layers().size();
                   })
      .def(
          "get_layer_group_id",
          [](PyManager& self, nb::handle layer_id) {
            const ManagerLock lock(self.manager->context());
            self.manager->require_live();
            return self.manager->registry().layer_group_of(arg::layer_id(layer_id));
          },
          nb::arg("layer_id").none());
}

// Buffer addresses and pools (docs/manager.md, "Page addresses").
void define_layout(nb::class_<PyManager>& cls) {
  cls.def(
         "get_mem_pool_base_address",
         [](PyManager& self, nb::handle layer_id, nb::handle role, nb::handle index_mode) {
           const ManagerLock lock(self.manager->context());
           const BufferPlacement& p = placement(self, layer_id, role);
           if (index_mode.is_none() && self.manager->config().swa_scratch_reuse) {
             fail(PyExc_ValueError, "get_mem_pool_base_address: index_mode is required with swa_scratch_reuse");
           }
           const bool shared = !index_mode.is_none() && arg::shared_index_mode(index_mode);
           return self.manager->mem_pool_base_address(p, shared);
         },
         nb::arg("layer_id").none(), nb::arg("role").none(), nb::arg("index_mode").none() = nb::none())
      .def(
          "get_page_stride",
          [](PyManager& self, nb::handle layer_id, nb::handle role) {
            const ManagerLock lock(self.manager->context());
            return placement(self, layer_id, role).page_size;
          },
          nb::arg("layer_id").none(), nb::arg("role").none())
      .def(
          "get_page_index_converter",
          [](PyManager& self, nb::handle layer_id, nb::handle role) {
            const ManagerLock lock(self.manager->context());
            const BufferPlacement& p = placement(self, layer_id, role);
            return api("PageIndexConverter")(p.scale, p.expansion, p.position, p.expansion);
          },
          nb::arg("layer_id").none(), nb::arg("role").none())
      .def(
          "get_page_index_upper_bound",
          [](PyManager& self, nb::handle layer_id, nb::handle role) {
            const ManagerLock lock(self.manager->context());
            return self.manager->page_index_upper_bound(placement(self, layer_id, role));
          },
          nb::arg("layer_id").none(), nb::arg("role").none())
      .def(
          "get_buffer_location",
          [](PyManager& self, nb::handle layer_id, nb::handle role) {
            const ManagerLock lock(self.manager->context());
            const auto loc = self.manager->buffer_location(placement(self, layer_id, role));
            return api("BufferLocation")(loc.pool_group, loc.pool, loc.page_stride);
          },
          nb::arg("layer_id").none(), nb::arg("role").none())
      .def_prop_ro("pool_group_descs", &pool_group_descs)
      .def("pool_memory", &pool_memory, nb::arg("pool_group").none(), nb::arg("pool").none());
}

// Quotas, level statistics, quota resizes and the auto-tuner.
void define_levels(nb::class_<PyManager>& cls) {
  cls.def(
         "get_quota",
         [](PyManager& self, nb::handle level) {
           const ManagerLock lock(self.manager->context());
           const int l = arg::cache_level(level, self.manager->num_levels());
           self.manager->require_live();
           return self.manager->counts(l).quota;
         },
         nb::arg("level").none() = 0)
      .def("get_storage_statistics", &storage_statistics, nb::arg("level").none() = 0)
      .def(
          "resize",
          [](PyManager& self, nb::handle level, nb::handle quota, nb::handle best_efforts) {
            // kv_core_py's order: state, every cache suspended, then the arguments left to right.
            const ManagerLock lock(self.manager->context());
            self.manager->require_live();
            if (const std::size_t active = self.manager->num_active_caches()) {
              fail(kv_api().errors.attr("InvalidStateError").ptr(), msg::kResizeNeedsSuspended,
                   {std::to_string(active)});
            }
            const int l = arg::cache_level(level, self.manager->num_levels());
            const std::uint64_t q = arg::quota(quota);
            if (arg::strict_bool("best_efforts", best_efforts)) fail(PyExc_NotImplementedError, msg::kBestEfforts);
            nb::gil_scoped_release release;
            return self.manager->resize(l, q);
          },
          nb::arg("level").none(), nb::arg("quota").none(), nb::arg("best_efforts").none() = false)
      .def_prop_ro("layout_version",
                   [](PyManager& self) {
                     const ManagerLock lock(self.manager->context());
                     self.manager->require_live();
                     return self.manager->layout_version();
                   })
      .def_prop_ro("need_adjustment",
                   [](PyManager& self) {
                     const ManagerLock lock(self.manager->context());
                     self.manager->require_live();
                     return self.manager->need_adjustment();
                   })
      .def("adjust",
           [](PyManager& self) {
             // kv_core_py's order: state, then every cache suspended.
             const ManagerLock lock(self.manager->context());
             self.manager->require_live();
             if (const std::size_t active = self.manager->num_active_caches()) {
               fail(kv_api().errors.attr("InvalidStateError").ptr(), msg::kAdjustNeedsSuspended,
                    {std::to_string(active)});
             }
             nb::gil_scoped_release release;
             return self.manager->adjust();
           })
      .def("get_bytes_moved", [](PyManager& self) {
        std::vector<std::pair<std::pair<int, int>, std::uint64_t>> moved;
        {
          nb::gil_scoped_release release;
          moved = self.manager->get_bytes_moved();
        }
        nb::dict out;
        for (const auto& [key, bytes] : moved) {
          out[nb::make_tuple(key.first, key.second)] = nb::steal(PyLong_FromUnsignedLongLong(bytes));
        }
        return out;
      });
}

// The statistics the manager counts.
void define_statistics(nb::class_<PyManager>& cls) {
  cls.def("get_committed_stats", [](PyManager& self) { return stats(self, &KVCacheManager::get_committed_stats); })
      .def("get_and_reset_iteration_stats",
           [](PyManager& self) { return stats(self, &KVCacheManager::get_and_reset_iteration_stats); })
      .def("get_and_reset_iteration_stats_by_life_cycle",
           [](PyManager& self) {
             std::map<int, LifeCycleStats> taken;
             {
               nb::gil_scoped_release release;
               taken = self.manager->get_and_reset_iteration_stats_by_life_cycle();
             }
             nb::dict out;
             for (const auto& [group, s] : taken) {
               out[nb::int_(group)] = api("stats.LifeCycleStats")(s.allocated_pages, s.committed_pages);
             }
             return out;
           })
      .def("get_and_reset_ssm_snapshot_iteration_stats",
           [](PyManager& self) {
             SsmSnapshotStats s;
             {
               nb::gil_scoped_release release;
               s = self.manager->get_and_reset_ssm_snapshot_iteration_stats();
             }
             return api("stats.SsmSnapshotStats")(s.stored, s.skipped, s.reused);
           })
      .def(
          "get_and_reset_iteration_peak_block_stats",
          [](PyManager& self, nb::handle level) {
            const ManagerLock lock(self.manager->context());
            const int l = arg::cache_level(level, self.manager->num_levels());
            return self.manager->get_and_reset_iteration_peak_block_stats(l);
          },
          nb::arg("level").none() = 0);
}

// Excluded and dirty cache ids, and sizing.
void define_bookkeeping(nb::class_<PyManager>& cls) {
  cls.def(
         "mark_stats_excluded",
         [](PyManager& self, nb::handle cache_id) {
           const ManagerLock lock(self.manager->context());
           self.manager->mark_stats_excluded(cache_id_arg(cache_id));
         },
         nb::arg("cache_id").none())
      .def(
          "is_stats_excluded",
          [](PyManager& self, nb::handle cache_id) {
            const ManagerLock lock(self.manager->context());
            return self.manager->is_stats_excluded(cache_id_arg(cache_id));
          },
          nb::arg("cache_id").none())
      .def(
          "mark_stats_dirty",
          [](PyManager& self, nb::handle cache_id) {
            const ManagerLock lock(self.manager->context());
            self.manager->mark_stats_dirty(cache_id_arg(cache_id));
          },
          nb::arg("cache_id").none())
      .def(
          "clear_stats_dirty",
          [](PyManager& self, nb::handle cache_id) {
            const ManagerLock lock(self.manager->context());
            self.manager->clear_stats_dirty(cache_id_arg(cache_id));
          },
          nb::arg("cache_id").none())
      .def("get_dirty_stats_kv_cache_ids",
           [](PyManager& self) {
             const ManagerLock lock(self.manager->context());
             return self.manager->get_dirty_stats_kv_cache_ids();
           })
      .def(
          "clamp_max_seq_len_for_mem",
          [](PyManager& self, nb::handle batch_size, nb::handle token_upper_bound) {
            const ManagerLock lock(self.manager->context());
            self.manager->require_live();
            const std::int64_t n = arg::int_between("batch_size", batch_size, 1, kTokenLimit);
            const std::int64_t bound = arg::int_between("token_upper_bound", token_upper_bound, 0, kTokenLimit);
            nb::gil_scoped_release release;
            return self.manager->clamp_max_seq_len_for_mem(n, bound);
          },
          nb::arg("batch_size").none(), nb::arg("token_upper_bound").none());
}

// Open caches and the manager's end (reuse probes and create_kv_cache: register_manager_reuse.cc).
void define_caches(nb::class_<PyManager>& cls) {
  cls.def_prop_ro("num_open_kv_caches",
                  [](PyManager& self) {
                    const ManagerLock lock(self.manager->context());
                    return self.manager->num_open_kv_caches();
                  })
      .def("clear_reusable_blocks",
           [](PyManager& self) {
             nb::gil_scoped_release release;
             self.manager->clear_reusable_blocks();
           })
      .def("shutdown", [](PyManager& self) {
        nb::gil_scoped_release release;
        self.manager->shutdown();
      });
}

}  // namespace

// Every argument is declared .none(): nanobind would refuse None with its own TypeError before
// the state and the earlier arguments are checked, so None goes to the checkers (arguments.h).
void register_manager(nb::module_& m) {
  nb::class_<PoolBuffer>(m, "PoolBuffer", nb::type_slots(pool_buffer_slots));
  nb::class_<PyManager> cls(m, "KVCacheManager");
  define_configuration(cls);
  define_layout(cls);
  define_levels(cls);
  define_statistics(cls);
  define_bookkeeping(cls);
  define_caches(cls);
}

}  // namespace kvcore::py
