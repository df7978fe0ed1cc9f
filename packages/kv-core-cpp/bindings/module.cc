// kv_core_cpp._core: the thin nanobind layer over the kvcore library.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "kvcore/build_info.h"
#include "kvcore/constants.h"
#include "kvcore/poison.h"
#include "kvcore/sha256.h"
#include "kvcore/tokens.h"
#include "python_api.h"
#include "register.h"

namespace nb = nanobind;

NB_MODULE(_core, m) {
  // Resolve the SHA-256 transform now, so a bad KVCORE_SHA256 fails the import clearly.
  kvcore::sha256::active();
  // Managers and caches held by module globals may outlive nanobind's internals at exit, which
  // it reports as leaks; reference counts are checked by the conformance suite instead.
  nb::set_leak_warnings(false);
  kvcore::py::init_kv_api();
  kvcore::py::register_errors(m);
  kvcore::py::register_keys(m);
  kvcore::py::register_event_manager(m);
  kvcore::py::register_manager(m);
  kvcore::py::register_manager_reuse(m);
  kvcore::py::register_kv_cache(m);
  kvcore::py::register_planned_drop(m);
  kvcore::py::register_batch(m);

  // kv_api.constants as the core uses them, for the conformance suite to compare.
  m.attr("BAD_PAGE_INDEX") = kvcore::kBadPageIndex;
  m.attr("GPU_LEVEL") = kvcore::kGpuLevel;
  m.attr("MIN_PRIORITY") = kvcore::kMinPriority;
  m.attr("DEFAULT_PRIORITY") = kvcore::kDefaultPriority;
  m.attr("MAX_PRIORITY") = kvcore::kMaxPriority;
  m.attr("TOKEN_LIMIT") = kvcore::kTokenLimit;
  m.attr("CACHE_ID_LIMIT") = kvcore::kCacheIdLimit;
  m.attr("EVENT_ENTRIES_LIMIT") = kvcore::kEventEntriesLimit;
  nb::list formats;
  for (const char* name : kvcore::kKeyFormatNames) formats.append(name);
  m.attr("KEY_FORMATS") = nb::steal(PyList_AsTuple(formats.ptr()));
  m.attr("DEFAULT_KEY_FORMAT") = kvcore::key_format_name(kvcore::kDefaultKeyFormat);

  m.def("build_info", &kvcore::build_info, "Compiler, flags, build type and the SHA-256 transform in use.");
  m.def("sha256_transforms", &kvcore::sha256::available, "SHA-256 transforms this build and CPU can run.");
  m.def("sha256_transform", [] { return std::string(kvcore::sha256::active().name); }, "The SHA-256 transform in use.");
  // The poison latch (kvcore/poison.h), as kv_api.contract.Backend declares it; kv_core_cpp
  // exports the debug hook as _debug_poison, as kv_core_py does.
  m.def("poison_reason", &kvcore::poison::reason, "The first recorded invariant violation, or None; never clears it.");
  m.def("take_poison", &kvcore::poison::take,
        "Clear the poison latch and return its reason (None when not poisoned); LogicError while a manager lives.");
  m.def("num_live_managers", &kvcore::poison::num_live_managers, "Managers built and neither shut down nor destroyed.");
  m.def("debug_poison", &kvcore::poison::debug_poison, nb::arg("reason"),
        "Poison the backend as an invariant violation would; RuntimeError unless KV_DEBUG_HOOKS=1.");
  m.def("select_sha256_transform", &kvcore::sha256::select, nb::arg("name"),
        "Force a SHA-256 transform (tests and benchmarks); ValueError if this machine cannot run it.");
}
