#include "python_api.h"

#include <climits>
#include <cstring>

#include "kvcore/error.h"
#include "token_input.h"

namespace kvcore::py {

namespace {
KvApi* g_api = nullptr;
nb::module_* g_module = nullptr;
}  // namespace

nb::object api(const char* name) {
  const std::string dotted(name);
  const std::size_t dot = dotted.rfind('.');
  if (dot == std::string::npos) return g_module->attr(name);
  return nb::module_::import_(("kv_api." + dotted.substr(0, dot)).c_str()).attr(dotted.substr(dot + 1).c_str());
}

const KvApi& kv_api() { return *g_api; }

void init_kv_api() {
  nb::module_ api = nb::module_::import_("kv_api");
  g_module = new nb::module_(api);
  // Kept for the life of the process: the module may be used until interpreter exit.
  g_api = new KvApi{api.attr("ReuseScope"), api.attr("MmItemContext"), api.attr("KVCacheManagerConfig"),
                    nb::module_::import_("kv_api.errors")};
}

void raise(PyObject* type, const std::string& message) {
  PyErr_SetString(type, message.c_str());
  throw nb::python_error();
}

std::string py_type_name(nb::handle obj) { return nb::cast<std::string>(nb::handle(obj.type()).attr("__name__")); }

std::string str(nb::handle obj) { return nb::cast<std::string>(nb::str(obj)); }

namespace {

// kv_api._check.int_in_range with an optional upper bound of 2**64.
std::uint64_t int_in_range(const char* where, nb::handle value, std::int64_t low, bool below_2_64) {
  if (PyBool_Check(value.ptr()) || !PyIndex_Check(value.ptr())) {
    raise(PyExc_TypeError, std::string(where) + ": expected an int, got " + py_type_name(value));
  }
  nb::object index = nb::steal(PyNumber_Index(value.ptr()));
  if (!index.is_valid()) throw nb::python_error();
  const std::string rule =
      below_2_64 ? "in [" + std::to_string(low) + ", 18446744073709551616)" : ">= " + std::to_string(low);
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (overflow < 0 || (overflow == 0 && v < low)) {
    raise(PyExc_ValueError, std::string(where) + ": must be " + rule + " (got " + str(index) + ")");
  }
  if (overflow == 0) return static_cast<std::uint64_t>(v);
  const unsigned long long u = PyLong_AsUnsignedLongLong(index.ptr());
  if (!PyErr_Occurred()) return u;
  PyErr_Clear();
  if (below_2_64) raise(PyExc_ValueError, std::string(where) + ": must be " + rule + " (got " + str(index) + ")");
  return ULLONG_MAX;  // beyond any size this process can hold
}

}  // namespace

std::uint64_t int_at_least(const char* where, nb::handle value, std::int64_t low) {
  return int_in_range(where, value, low, false);
}

std::uint64_t u64(const char* where, nb::handle value) { return int_in_range(where, value, 0, true); }

ReuseScope reuse_scope(nb::handle scope) {
  ReuseScope out;
  if (scope.is_none()) return out;
  if (!nb::isinstance(scope, kv_api().reuse_scope)) {
    raise(PyExc_TypeError, "reuse_scope: expected ReuseScope or None, got " + py_type_name(scope));
  }
  // ReuseScope validated its fields (u64 or None) when it was built.
  nb::object lora = scope.attr("lora_id"), salt = scope.attr("salt");
  if (!lora.is_none()) out.lora_id = nb::cast<std::uint64_t>(lora);
  if (!salt.is_none()) out.salt = nb::cast<std::uint64_t>(salt);
  return out;
}

KeyFormat key_format(nb::handle format) {
  if (!PyUnicode_Check(format.ptr())) {
    raise(PyExc_TypeError, "key_format: expected a str, got " + py_type_name(format));
  }
  const std::string name = nb::cast<std::string>(format);
  if (name != "sha256-u32" && name != "sha256-u64") {
    raise(PyExc_ValueError, "key_format: unknown " + nb::cast<std::string>(nb::repr(format)) +
                                " (expected one of sha256-u32, sha256-u64)");
  }
  return parse_key_format(name);
}

Digest key_digest(const char* where, nb::handle key) {
  if (!PyBytes_Check(key.ptr()))
    raise(PyExc_TypeError, std::string(where) + ": expected bytes, got " + py_type_name(key));
  if (PyBytes_GET_SIZE(key.ptr()) != 32) {
    raise(PyExc_ValueError,
          std::string(where) + ": must be 32 bytes (got " + std::to_string(PyBytes_GET_SIZE(key.ptr())) + ")");
  }
  Digest d;
  std::memcpy(d.data(), PyBytes_AS_STRING(key.ptr()), d.size());
  return d;
}

TokenList token_list(nb::handle tokens, KeyFormat format) {
  if (tokens.is_none()) return TokenList{};
  TokenInput input(tokens, format);
  return TokenList::from(input.tokens(), 0, input.tokens().count);
}

nb::object token_objects(const TokenList& tokens) {
  nb::list out;
  std::size_t d = 0;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (d < tokens.digests.size() && tokens.digests[d].position == i) {
      const Digest& digest = tokens.digests[d++].digest;
      out.append(nb::bytes(reinterpret_cast<const char*>(digest.data()), digest.size()));
    } else {
      out.append(nb::steal(PyLong_FromUnsignedLongLong(tokens.ids[i])));
    }
  }
  return out;
}

nb::object optional_int(const std::optional<std::int64_t>& v) {
  return v ? nb::object(nb::int_(*v)) : nb::object(nb::none());
}

nb::object scope_object(const ReuseScope& scope) {
  auto field = [](const std::optional<std::uint64_t>& v) -> nb::object {
    return v ? nb::steal(PyLong_FromUnsignedLongLong(*v)) : nb::none();
  };
  return kv_api().reuse_scope(field(scope.lora_id), field(scope.salt));
}

}  // namespace kvcore::py
