#include "arguments.h"

#include <nanobind/stl/string.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <iterator>

#include "kvcore/constants.h"
#include "py_objects.h"
#include "python_api.h"

namespace kvcore::py {

std::string format(const char* message, std::initializer_list<std::string_view> args) {
  std::string text;
  auto next = args.begin();
  for (const char* p = message; *p; ++p) {
    if (p[0] == '{' && p[1] == '}' && next != args.end()) {
      text += *next++;
      ++p;
    } else {
      text += *p;
    }
  }
  return text;
}

void fail(PyObject* type, const char* message, std::initializer_list<std::string_view> args) {
  raise(type, format(message, args));
}

namespace arg {

namespace {

// kv_api._check.as_int: bool and objects without __index__ are a TypeError.
nb::object as_int(const char* where, nb::handle value) {
  if (PyBool_Check(value.ptr()) || !PyIndex_Check(value.ptr())) {
    fail(PyExc_TypeError, msg::kExpectedInt, {where, py_type_name(value)});
  }
  nb::object index = nb::steal(PyNumber_Index(value.ptr()));
  if (!index.is_valid()) throw nb::python_error();
  return index;
}

// kv_api._check.int_in_range with an optional upper bound of 2**64.
std::uint64_t int_in_range(const char* where, nb::handle value, std::int64_t low, bool below_2_64) {
  if (long long v; exact_int(value, v) && v >= low) return static_cast<std::uint64_t>(v);  // the usual argument
  nb::object index = as_int(where, value);
  auto out_of_range = [&] {
    const std::string rule =
        below_2_64 ? "in [" + std::to_string(low) + ", 18446744073709551616)" : ">= " + std::to_string(low);
    fail(PyExc_ValueError, msg::kMustBe, {where, rule, py::str(index)});
  };
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (overflow < 0 || (overflow == 0 && v < low)) out_of_range();
  if (overflow == 0) return static_cast<std::uint64_t>(v);
  const unsigned long long u = PyLong_AsUnsignedLongLong(index.ptr());
  if (!PyErr_Occurred()) return u;
  PyErr_Clear();
  if (below_2_64) out_of_range();
  return ULLONG_MAX;
}

}  // namespace

std::uint64_t int_at_least(const char* where, nb::handle value, std::int64_t low) {
  return int_in_range(where, value, low, false);
}

std::uint64_t u64(const char* where, nb::handle value) { return int_in_range(where, value, 0, true); }

std::int64_t int_between(const char* where, nb::handle value, std::int64_t low, std::int64_t high) {
  if (long long v; exact_int(value, v) && v >= low && v < high) return v;  // a batch reads one per item
  nb::object index = as_int(where, value);
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (overflow || v < low || v >= high) {
    const std::string rule = "in [" + std::to_string(low) + ", " + std::to_string(high) + ")";
    fail(PyExc_ValueError, msg::kMustBe, {where, rule, py::str(index)});
  }
  return v;
}

std::optional<std::int64_t> optional_count(const char* where, nb::handle value, std::int64_t high) {
  if (value.is_none()) return std::nullopt;
  return int_between(where, value, 0, high);
}

std::uint64_t index_below(const char* where, nb::handle value, std::size_t size) {
  const std::uint64_t v = int_at_least(where, value, 0);
  if (v >= size) {
    fail(PyExc_IndexError, msg::kOutOfRange,
         {where, py::str(as_int(where, value)), std::to_string(static_cast<long long>(size) - 1)});
  }
  return v;
}

int cache_level(nb::handle level, int num_levels, const char* name) {
  const std::uint64_t v = int_at_least(name, level, 0);
  if (v >= static_cast<std::uint64_t>(num_levels)) {
    fail(PyExc_IndexError, msg::kLevelOutOfRange, {name, py::str(as_int(name, level)), std::to_string(num_levels - 1)});
  }
  return static_cast<int>(v);
}

void beam(nb::handle beam) {
  if (int_at_least("beam", beam, 0) != 0) fail(PyExc_IndexError, msg::kBeamOutOfRange, {py::str(as_int("beam", beam))});
}

std::int64_t layer_id(nb::handle value) {
  nb::object index = as_int("layer_id", value);
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (overflow) fail(PyExc_KeyError, msg::kNoLayer, {py::str(index)});
  return v;
}

std::string str(const char* where, nb::handle value) {
  if (!PyUnicode_Check(value.ptr())) fail(PyExc_TypeError, msg::kExpectedStr, {where, py_type_name(value)});
  Py_ssize_t size = 0;
  const char* utf8 = PyUnicode_AsUTF8AndSize(value.ptr(), &size);
  if (!utf8) throw nb::python_error();
  return std::string(utf8, static_cast<std::size_t>(size));
}

std::optional<std::string> name(const char* where, nb::handle value) {
  if (!PyUnicode_Check(value.ptr())) fail(PyExc_TypeError, msg::kExpectedStr, {where, py_type_name(value)});
  Py_ssize_t size = 0;
  const char* utf8 = PyUnicode_AsUTF8AndSize(value.ptr(), &size);
  if (utf8) return std::string(utf8, static_cast<std::size_t>(size));
  if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) throw nb::python_error();
  PyErr_Clear();
  return std::nullopt;
}

bool truthy(nb::handle value) {
  const int truth = PyObject_IsTrue(value.ptr());
  if (truth < 0) throw nb::python_error();
  return truth == 1;
}

ReuseScope reuse_scope(nb::handle scope) {
  ReuseScope out;
  if (scope.is_none()) return out;
  if (!nb::isinstance(scope, kv_api().reuse_scope)) fail(PyExc_TypeError, msg::kExpectedScope, {py_type_name(scope)});
  // Checked again as ReuseScope.__post_init__ checks them (kv_api.keys.check_reuse_scope does
  // the same): a scope built past it (object.__new__, object.__setattr__) may hold anything.
  nb::object lora = scope.attr("lora_id");
  if (!lora.is_none()) out.lora_id = u64(msg::kScopeLoraId, lora);
  nb::object salt = scope.attr("salt");
  if (!salt.is_none()) out.salt = u64(msg::kScopeSalt, salt);
  return out;
}

KeyFormat key_format(nb::handle format) {
  const std::optional<std::string> name = arg::name("key_format", format);
  if (!name || std::find(std::begin(kKeyFormatNames), std::end(kKeyFormatNames), *name) == std::end(kKeyFormatNames)) {
    std::string names;
    for (const char* n : kKeyFormatNames) names += (names.empty() ? "" : ", ") + std::string(n);
    fail(PyExc_ValueError, msg::kUnknownKeyFormat, {py_repr(format), names});
  }
  return parse_key_format(*name);
}

Digest digest(const char* where, nb::handle value) {
  if (!PyBytes_Check(value.ptr())) fail(PyExc_TypeError, msg::kExpectedBytes, {where, py_type_name(value)});
  if (PyBytes_GET_SIZE(value.ptr()) != 32) {
    fail(PyExc_ValueError, msg::kDigestSize, {where, std::to_string(PyBytes_GET_SIZE(value.ptr()))});
  }
  Digest d;
  std::memcpy(d.data(), PyBytes_AS_STRING(value.ptr()), d.size());
  return d;
}

bool shared_index_mode(nb::handle mode) {
  // kv_api's enum converts (and refuses) the value, as kv_core_py's PageIndexMode(index_mode).
  return nb::cast<int>(api("PageIndexMode")(mode)) == 1;
}

void manager_config(nb::handle config) {
  if (!nb::isinstance(config, kv_api().manager_config)) {
    fail(PyExc_TypeError, msg::kExpectedConfig, {py_type_name(config)});
  }
}

KVCacheEventManager* event_manager(nb::handle events) {
  if (events.is_none()) return nullptr;
  if (!nb::isinstance<PyEventManager>(events))
    fail(PyExc_TypeError, msg::kExpectedEventManager, {py_type_name(events)});
  return nb::cast<PyEventManager&>(events).events.get();
}

std::uint64_t quota(nb::handle value) {
  nb::object index = as_int("quota", value);
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (overflow || v < 1) fail(PyExc_ValueError, msg::kMustBe, {"quota", "in [1, 9223372036854775808)", py::str(index)});
  return static_cast<std::uint64_t>(v);
}

bool strict_bool(const char* where, nb::handle value) {
  if (!PyBool_Check(value.ptr())) fail(PyExc_TypeError, msg::kExpectedBool, {where, py_type_name(value)});
  return value.ptr() == Py_True;
}

std::optional<bool> optional_bool(const char* where, nb::handle value) {
  if (value.is_none()) return std::nullopt;
  if (!PyBool_Check(value.ptr())) fail(PyExc_TypeError, msg::kExpectedBoolOrNone, {where, py_type_name(value)});
  return value.ptr() == Py_True;
}

void page_copier(nb::handle copier) {
  if (!copier.is_none() && !nb::isinstance(copier, api("PageCopier")))
    fail(PyExc_TypeError, msg::kExpectedPageCopier, {py_type_name(copier)});
}

void callable_or_none(nb::handle callback) {
  if (!callback.is_none() && !PyCallable_Check(callback.ptr())) fail(PyExc_TypeError, msg::kExpectedCallable);
}

int priority(nb::handle value) {
  // An int exactly (no __index__), as kv_core_py's isinstance(value, int).
  if (PyBool_Check(value.ptr()) || !PyLong_Check(value.ptr())) {
    fail(PyExc_TypeError, msg::kExpectedInt, {"custom_priority_callback", py_type_name(value)});
  }
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
  if (overflow || v < kMinPriority || v > kMaxPriority) {
    fail(PyExc_ValueError, msg::kPriorityOutside,
         {py::str(value), std::to_string(kMinPriority), std::to_string(kMaxPriority)});
  }
  return static_cast<int>(v);
}

std::int64_t event_entries(nb::handle value) {
  return int_between("max_kv_event_entries", value, -kEventEntriesLimit, kEventEntriesLimit);
}

HashAlgo hash_algo(nb::handle name) {
  const std::optional<std::string> algo = arg::name("hash_algo", name);
  if (!algo || (*algo != "auto" && *algo != "v2_sha256" && *algo != "v2_sha256_64" && *algo != "v1_block_key")) {
    fail(PyExc_ValueError, msg::kUnsupportedHashAlgo, {py_repr(name)});
  }
  return parse_hash_algo(*algo);
}

double timeout_ms(nb::handle value) {
  if (value.is_none()) return -1;
  PyObject* v = value.ptr();
  if (PyBool_Check(v) || !(PyLong_Check(v) || PyFloat_Check(v))) {
    fail(PyExc_TypeError, msg::kExpectedNumberOrNone, {"timeout_ms", py_type_name(value)});
  }
  double timeout = PyFloat_Check(v) ? PyFloat_AsDouble(v) : PyLong_AsDouble(v);
  if (timeout == -1.0 && PyErr_Occurred()) {  // an int beyond any double: an endless wait, or none
    PyErr_Clear();
    int sign = 0;
    PyLong_AsLongLongAndOverflow(v, &sign);
    timeout = sign > 0 ? HUGE_VAL : -HUGE_VAL;
  }
  if (std::isnan(timeout)) fail(PyExc_ValueError, msg::kNotNaN, {"timeout_ms"});
  if (std::isinf(timeout) && timeout > 0) return -1;
  return timeout > 0 ? timeout : 0;
}

Py_buffer index_buffer(nb::handle buf) {
  Py_buffer view;
  if (PyObject_GetBuffer(buf.ptr(), &view, PyBUF_FULL_RO) != 0) {
    PyErr_Clear();
    // A DLPack tensor (torch has no buffer protocol): kv_api views it, as kv_core_py does.
    nb::object tensor = api("dlpack.as_buffer")(buf, "buf");
    if (tensor.is_none()) fail(PyExc_TypeError, msg::kExpectedIndexBuffer, {py_type_name(buf)});
    if (PyObject_GetBuffer(tensor.ptr(), &view, PyBUF_FULL_RO) != 0) throw nb::python_error();
  }
  const char* fmt = view.format ? view.format : "B";
  const bool int32 =
      !std::strcmp(fmt, "i") || !std::strcmp(fmt, "@i") || !std::strcmp(fmt, "=i") || !std::strcmp(fmt, "<i");
  if (view.readonly || view.ndim != 1 || !int32) {
    const std::string format = py_repr(nb::str(fmt));
    PyBuffer_Release(&view);
    fail(PyExc_ValueError, msg::kIndexBufferFormat, {format});
  }
  if (!PyBuffer_IsContiguous(&view, 'C')) {
    PyBuffer_Release(&view);
    fail(PyExc_ValueError, msg::kIndexBufferContiguous);
  }
  return view;
}

}  // namespace arg

}  // namespace kvcore::py
