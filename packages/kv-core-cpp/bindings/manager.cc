// The manager class: converts the kv_api config, then delegates to kvcore::Manager.
#include "kvcore/manager.h"

#include <memory>

#include "bind.h"
#include "python_api.h"

namespace kvcore::py {

namespace {

class PyManager {
 public:
  PyManager(nb::handle config, nb::handle /*event_manager*/) {
    if (!nb::isinstance(config, kv_api().manager_config)) {
      raise(PyExc_TypeError, "config: expected KVCacheManagerConfig, got " + py_type_name(config));
    }
    // The config is frozen and validated by kv_api, so its fields are read as they are.
    config_ = nb::borrow(config);
    ManagerConfig c;
    c.tokens_per_block = nb::cast<std::size_t>(config.attr("tokens_per_block"));
    manager_ = std::make_unique<Manager>(c);
  }

  nb::object init_config() const { return config_; }
  std::size_t tokens_per_block() const { return manager_->tokens_per_block(); }

 private:
  nb::object config_;
  std::unique_ptr<Manager> manager_;
};

}  // namespace

void bind_manager(nb::module_& m) {
  nb::class_<PyManager>(m, "KVCacheManager")
      .def(nb::init<nb::handle, nb::handle>(), nb::arg("config").none(), nb::arg("event_manager").none() = nb::none())
      .def_prop_ro("init_config", &PyManager::init_config)
      .def_prop_ro("tokens_per_block", &PyManager::tokens_per_block);
}

}  // namespace kvcore::py
