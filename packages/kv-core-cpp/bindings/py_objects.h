// The Python-facing objects that own core objects; shared by the register_*.cc files.
#pragma once

#include <nanobind/nanobind.h>

#include <map>
#include <memory>

#include "kvcore/block_store.h"
#include "kvcore/event_manager.h"
#include "kvcore/kv_cache.h"
#include "kvcore/manager.h"
#include "kvcore/planned_drop.h"

namespace kvcore::py {

namespace nb = nanobind;

// The manager's lock (its CacheContext's), held for a whole binding call so that state checks,
// argument conversion, the core call and the binding's own state (a cache's exported buffers) see
// one state. It never waits holding the GIL: a thread holding the lock may be waiting for the GIL
// (a priority callback), so it tries first and otherwise waits with the GIL released.
class ManagerLock {
 public:
  explicit ManagerLock(CacheContext& context) : lock_(context.try_lock()) {
    if (!lock_.owns_lock()) {
      nb::gil_scoped_release release;
      lock_.lock();
    }
  }

 private:
  std::unique_lock<std::recursive_mutex> lock_;
};

struct PyEventManager {
  std::unique_ptr<KVCacheEventManager> events;
};

// A kv_api.PageCopier called from the core: the GIL is taken for the call (the core runs without it).
class PyPageCopier : public PageCopier {
 public:
  explicit PyPageCopier(nb::handle copier) : copier_(copier.ptr()) {}  // borrowed: PyManager owns it
  void copy(int src_level, int dst_level, const std::vector<CopyRun>& runs) override;

 private:
  PyObject* copier_;
};

// A kv_api.BlockStore called from the core (py_block_store.cc): the GIL is taken for each call;
// an Exception the store raises is its fault, a miss (-1, false) the core counts, as
// kv_core_py's remote tier catches them; a BaseException (KeyboardInterrupt) propagates.
class PyBlockStore : public BlockStore {
 public:
  explicit PyBlockStore(nb::handle store) : store_(store.ptr()) {}  // borrowed: PyManager owns it
  std::int64_t contains(const StoreKeys& keys) override;
  std::int64_t get_into(const StoreKeys& keys, const std::vector<ValueBuffer>& buffers) override;
  double put(const std::vector<std::string>& keys, const std::uint8_t* values, std::size_t value_size) override;

 private:
  PyObject* store_;
};

struct PyManager {
  nb::object config;                          // the kv_api config, as given (frozen)
  nb::object event_manager;                   // keeps the events alive as long as the manager
  nb::object page_copier;                     // the Python copier (None: the core's own copies)
  std::unique_ptr<PyPageCopier> copier;       // declared before the manager: destroyed after it
  nb::object store;                           // the remote tier's kv_api.BlockStore (None: no remote tier)
  std::unique_ptr<PyBlockStore> block_store;  // declared before the manager: destroyed after it
  std::unique_ptr<KVCacheManager> manager;
  nb::tuple life_cycles;  // kv_api.LifeCycle objects (with get_stale_range), handed to priority callbacks
};

struct PyKVCache {
  ~PyKVCache();
  nb::object manager;   // the PyManager, kept alive while the cache lives
  nb::object priority;  // the Python callback, if any (the core holds it borrowed)
  std::unique_ptr<KVCache> cache;
  std::map<int, Py_buffer> buffers;  // caller index buffers, exported while attached
};

struct PyPlannedDropHandle {
  ~PyPlannedDropHandle();
  nb::object manager;  // the PyManager, kept alive while the handle lives (the core needs its context)
  std::unique_ptr<PlannedDropHandle> handle;
};

// A Python priority callback as the core calls it (register_manager.cc); empty for None.
PriorityCallback priority_callback(nb::handle callback, PyManager& self);

}  // namespace kvcore::py
