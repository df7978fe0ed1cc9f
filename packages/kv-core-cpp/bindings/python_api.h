// Python-side objects the bindings need: kv_api classes and conversions of core values to
// Python objects. Argument checks are in arguments.h.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <string>

#include "kvcore/block_keys.h"
#include "kvcore/error.h"
#include "kvcore/tokens.h"

namespace kvcore::py {

namespace nb = nanobind;

struct KvApi {
  nb::object reuse_scope;         // kv_api.ReuseScope
  nb::object mm_item_context;     // kv_api.MmItemContext
  nb::object manager_config;      // kv_api.KVCacheManagerConfig
  nb::object errors;              // kv_api.errors
  nb::object iterable;            // collections.abc.Iterable, kv_api.keys.token_list's test
  nb::object storage_statistics;  // kv_api.StorageStatistics (read once per engine step)
  nb::object reuse_report;        // kv_api.stats.ReuseReport (read once per admission)
  nb::object evicted_block;       // kv_api.stats.EvictedBlock
};

const KvApi& kv_api();
void init_kv_api();
nb::object api(const char* name);  // kv_api.<name>, e.g. "PageIndexConverter"

[[noreturn]] void raise(PyObject* type, const std::string& message);
// Sets the Python error a kvcore::Error translates to (register_errors.cc; the exception translator's).
void set_python_error(const Error& e);
std::string py_type_name(nb::handle obj);  // type(obj).__name__
std::string str(nb::handle obj);
std::string py_repr(nb::handle obj);  // repr(obj)

nb::object token_objects(const TokenList& tokens);              // a list of ints and 32-byte bytes
nb::object scope_object(const ReuseScope& scope);               // a kv_api.ReuseScope
nb::object optional_int(const std::optional<std::int64_t>& v);  // an int or None

}  // namespace kvcore::py
