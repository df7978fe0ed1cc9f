#include "python_api.h"

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
  g_api = new KvApi{api.attr("ReuseScope"),
                    api.attr("MmItemContext"),
                    api.attr("KVCacheManagerConfig"),
                    nb::module_::import_("kv_api.errors"),
                    nb::module_::import_("collections.abc").attr("Iterable"),
                    api.attr("StorageStatistics"),
                    api.attr("stats").attr("ReuseReport"),
                    api.attr("stats").attr("EvictedBlock")};
}

void raise(PyObject* type, const std::string& message) {
  PyErr_SetString(type, message.c_str());
  throw nb::python_error();
}

std::string py_type_name(nb::handle obj) { return nb::cast<std::string>(nb::handle(obj.type()).attr("__name__")); }

std::string str(nb::handle obj) { return nb::cast<std::string>(nb::str(obj)); }

std::string py_repr(nb::handle obj) { return nb::cast<std::string>(nb::repr(obj)); }

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
