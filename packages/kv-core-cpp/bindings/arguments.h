// Every check the binding makes on a Python argument before converting it for the core, and
// the one table of the messages they raise. The texts are kv_api's and kv_core_py's, byte for
// byte: the conformance suite compares both backends' messages, and tests/test_binding_messages.py
// checks each text against the f-string it mirrors and that bindings/*.cc uses it. The core keeps
// its own checks for C++ callers; these exist because a Python object must be typed and ranged
// before it can become a C++ value at all.
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include "kvcore/block_keys.h"
#include "kvcore/event_manager.h"
#include "kvcore/tokens.h"

namespace kvcore::py {

namespace nb = nanobind;

// The message table, grouped by the Python module whose f-strings it mirrors (a module named in a
// constant's trailing comment is that one's); `{}` stands where the f-string has a field, filled
// by `fail`'s arguments in order.
namespace msg {
// kv_api._check
inline constexpr char kExpectedInt[] = "{}: expected an int, got {}";
inline constexpr char kMustBe[] = "{}: must be {} (got {})";
inline constexpr char kExpectedNumberOrNone[] = "{}: expected a number or None, got {}";
inline constexpr char kNotNaN[] = "{}: must not be NaN";
// kv_api.keys
inline constexpr char kExpectedStr[] = "{}: expected a str, got {}";  // kv_api._check (as_str)
inline constexpr char kExpectedBytes[] = "{}: expected bytes, got {}";
inline constexpr char kDigestSize[] = "{}: must be 32 bytes (got {})";
inline constexpr char kExpectedScope[] = "reuse_scope: expected ReuseScope or None, got {}";
inline constexpr char kExpectedScopeList[] = "reuse_scopes: expected a list or tuple of ReuseScope or None, got {}";
inline constexpr char kExpectedTokenInputs[] = "token_inputs: expected a list or tuple of token inputs, got {}";
inline constexpr char kTokenInputsCount[] = "token_inputs: {} inputs for {} reuse scopes";
// kv_api.scope: a scope's fields, checked again where it is used (see arg::reuse_scope).
inline constexpr char kScopeLoraId[] = "ReuseScope.lora_id";
inline constexpr char kScopeSalt[] = "ReuseScope.salt";
// kv_api.keys
inline constexpr char kUnknownKeyFormat[] = "key_format: unknown {} (expected one of {})";  // kKeyFormatNames
inline constexpr char kExpectedTokens[] = "tokens: expected a buffer or an iterable of tokens, got {}";
inline constexpr char kTokenBufferDims[] = "tokens: a token buffer must be 1-D (got {} dimensions)";
inline constexpr char kTokenBufferFormat[] =
    "tokens: a token buffer must hold 4- or 8-byte integers in native byte order (got format {}, itemsize {})";
inline constexpr char kDigestTokenSize[] = "token {}: a digest token must be 32 bytes (got {})";
inline constexpr char kBoolToken[] = "token {}: bool is not a token id";
inline constexpr char kExpectedToken[] = "token {}: expected an int or a 32-byte digest, got {}";
inline constexpr char kNoV1Form[] = "token {}: a digest token has no v1_block_key form";
// kv_core_py.manager
inline constexpr char kExpectedConfig[] = "config: expected KVCacheManagerConfig, got {}";
inline constexpr char kExpectedEventManager[] = "event_manager: expected this backend's KVCacheEventManager, got {}";
inline constexpr char kNoLayer[] = "no layer {}";
inline constexpr char kNoBuffer[] = "no buffer {} in layer {}";  // kv_core_py.storage_config; the role's repr
inline constexpr char kOutOfRange[] = "{} {} out of range (0..{})";
inline constexpr char kLevelOutOfRange[] = "{} {} out of range (0..{})";  // the name, the level, the last level
inline constexpr char kExpectedBool[] = "{}: expected a bool, got {}";
inline constexpr char kExpectedBoolOrNone[] = "{}: expected a bool or None, got {}";
inline constexpr char kResizeNeedsSuspended[] = "resize() requires every KV cache suspended ({} active)";
inline constexpr char kAdjustNeedsSuspended[] = "adjust() requires every KV cache suspended ({} active)";
inline constexpr char kBestEfforts[] = "resize: best_efforts=True is not supported";
inline constexpr char kExpectedPageCopier[] = "page_copier: expected a kv_api.PageCopier, got {}";
inline constexpr char kExpectedCallable[] =
    "custom_priority_callback: expected a callable or None";  // kv_core_py.manager_reuse
// kv_core_py.cache_state
inline constexpr char kBeamOutOfRange[] = "beam {} out of range (beam width 1)";
inline constexpr char kPriorityOutside[] = "custom_priority_callback: {} is outside [{}, {}]";  // the bounds
// kv_core_py.cache_resize
inline constexpr char kNotEnoughPages[] = "{}: not enough pages";
// kv_core_py.page_indices
inline constexpr char kExpectedIndexBuffer[] = "buf: expected a writable int32 buffer, got {}";
inline constexpr char kIndexBufferFormat[] = "buf: must be a writable 1-D buffer of format 'i' (got format {})";
inline constexpr char kIndexBufferContiguous[] = "buf: must be contiguous";
// kv_core_py.batch
inline constexpr char kExpectedItems[] = "{}: expected a list or tuple, got {}";
inline constexpr char kItemsFor[] = "{}: {} items for {} {}";  // the name, its length, the first's length and name
inline constexpr char kExpectedCache[] = "{}: expected this backend's KVCache, got {}";
inline constexpr char kOtherManager[] = "{}: belongs to another manager";
inline constexpr char kCountsSum[] = "counts: add up to {} but tokens holds {}";
inline constexpr char kDecodeTokens[] = "tokens: holds {} for {} caches times {} steps";
inline constexpr char kDecodeIteration[] = "decode_steps: in iteration {} of {}; the {} before it took effect";
// kv_core_py.event_manager
inline constexpr char kUnsupportedHashAlgo[] =
    "hash_algo: Unsupported V2 KV cache event hash algorithm: {} (expected auto, v2_sha256, v2_sha256_64, "
    "v1_block_key)";
}  // namespace msg

// `message`, its `{}` replaced by `args` in order.
std::string format(const char* message, std::initializer_list<std::string_view> args);
// Raises `type` with format(message, args).
[[noreturn]] void fail(PyObject* type, const char* message, std::initializer_list<std::string_view> args = {});

// The checkers, named after what they accept; each returns the C++ value.
namespace arg {

// An exact int that fits 64 bits signed, read straight into `out` (no __index__, no error
// set); false for anything else, which the checkers below take the general way.
inline bool exact_int(nb::handle value, long long& out) noexcept {
  if (!PyLong_CheckExact(value.ptr())) return false;
  int overflow = 0;
  out = PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
  return !overflow;
}
// An int (not bool; anything with __index__) >= low, clamped to 2**64 - 1 (beyond any size).
std::uint64_t int_at_least(const char* where, nb::handle value, std::int64_t low);
// An int in [0, 2**64).
std::uint64_t u64(const char* where, nb::handle value);
// An int in [low, high): ValueError outside, never clamped.
std::int64_t int_between(const char* where, nb::handle value, std::int64_t low, std::int64_t high);
// None, or an int in [0, high) (ids and lengths).
std::optional<std::int64_t> optional_count(const char* where, nb::handle value, std::int64_t high);
// An int in [0, size): IndexError past the end.
std::uint64_t index_below(const char* where, nb::handle value, std::size_t size);
// A level the manager has (IndexError); `name` is the argument's.
int cache_level(nb::handle level, int num_levels, const char* name = "level");
void beam(nb::handle beam);               // beam 0, the one beam
std::int64_t layer_id(nb::handle value);  // any int; KeyError beyond int64 (no such layer)

std::string str(const char* where, nb::handle value);
// A str to look up among known names (a role, a hash algorithm, a key format); nullopt for one
// that is no UTF-8 (a lone surrogate): it names nothing, so the caller raises its usual "unknown"
// error, as kv_core_py's lookup does, instead of the UnicodeEncodeError of converting it.
std::optional<std::string> name(const char* where, nb::handle value);
bool truthy(nb::handle value);             // Python's `if value:`, errors included
ReuseScope reuse_scope(nb::handle scope);  // None or kv_api.ReuseScope, its fields checked again
KeyFormat key_format(nb::handle format);
Digest digest(const char* where, nb::handle value);  // 32 bytes
bool shared_index_mode(nb::handle mode);             // kv_api.PageIndexMode(mode) is SHARED

void manager_config(nb::handle config);                                  // a kv_api.KVCacheManagerConfig
KVCacheEventManager* event_manager(nb::handle events);                   // None or this backend's event manager
void page_copier(nb::handle copier);                                     // None or a kv_api.PageCopier (TypeError)
std::uint64_t quota(nb::handle value);                                   // an int in [1, 2**63)
bool strict_bool(const char* where, nb::handle value);                   // a bool exactly (TypeError)
std::optional<bool> optional_bool(const char* where, nb::handle value);  // None or a bool exactly (TypeError)
void callable_or_none(nb::handle callback);                              // custom_priority_callback
int priority(nb::handle value);                                          // what a priority callback returned
std::int64_t event_entries(nb::handle value);  // an int in [-kEventEntriesLimit, kEventEntriesLimit)
HashAlgo hash_algo(nb::handle name);
double timeout_ms(nb::handle value);  // kv_api._check.timeout_ms; None and +inf wait (-1), else at least 0

// A writable 1-D contiguous int32 export of `buf`; the caller releases it.
Py_buffer index_buffer(nb::handle buf);

}  // namespace arg

}  // namespace kvcore::py
