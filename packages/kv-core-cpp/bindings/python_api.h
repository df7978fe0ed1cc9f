// Python-side objects the bindings need: kv_api classes and argument checks that mirror
// kv_api's own, so both backends raise the same classes with the same messages.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <string>

#include "kvcore/block_keys.h"
#include "kvcore/tokens.h"

namespace kvcore::py {

namespace nb = nanobind;

struct KvApi {
  nb::object reuse_scope;      // kv_api.ReuseScope
  nb::object mm_item_context;  // kv_api.MmItemContext
  nb::object manager_config;   // kv_api.KVCacheManagerConfig
  nb::object errors;           // kv_api.errors
};

const KvApi& kv_api();
void init_kv_api();
nb::object api(const char* name);  // kv_api.<name>, e.g. "PageIndexConverter"

[[noreturn]] void raise(PyObject* type, const std::string& message);
std::string py_type_name(nb::handle obj);  // type(obj).__name__
std::string str(nb::handle obj);

// kv_api._check.int_in_range: an int (not bool) >= low; returns it clamped to uint64.
std::uint64_t int_at_least(const char* where, nb::handle value, std::int64_t low);
// A u64 in [0, 2**64): the same rule with the upper bound.
std::uint64_t u64(const char* where, nb::handle value);

ReuseScope reuse_scope(nb::handle scope);                       // None or kv_api.ReuseScope, else TypeError
KeyFormat key_format(nb::handle format);                        // a known format name, else TypeError/ValueError
Digest key_digest(const char* where, nb::handle key);           // 32 bytes, else TypeError/ValueError
TokenList token_list(nb::handle tokens, KeyFormat format);      // kv_api.keys.token_list; None is empty
nb::object token_objects(const TokenList& tokens);              // a list of ints and 32-byte bytes
nb::object scope_object(const ReuseScope& scope);               // a kv_api.ReuseScope
nb::object optional_int(const std::optional<std::int64_t>& v);  // an int or None

}  // namespace kvcore::py
