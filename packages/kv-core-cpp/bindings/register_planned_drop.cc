// PlannedDropHandle: kvcore::PlannedDropHandle without the GIL; released (dropped unless dropped
// already) when the Python object goes, as the Python backend's finaliser does.
#include "kvcore/planned_drop.h"
#include "kvcore/poison.h"
#include "py_objects.h"
#include "register.h"

namespace kvcore::py {

PyPlannedDropHandle::~PyPlannedDropHandle() {
  // Applying the plan takes the manager's lock, which a thread waiting for the GIL may hold.
  if (handle && !handle->dropped()) {
    nb::gil_scoped_release release;
    handle.reset();
  }
  handle.reset();
}

void register_planned_drop(nb::module_& m) {
  nb::class_<PyPlannedDropHandle>(m, "PlannedDropHandle")
      .def("drop",
           [](PyPlannedDropHandle& self) {
             nb::gil_scoped_release release;
             self.handle->drop();
           })
      .def("__enter__",
           [](nb::handle self) {
             poison::check();
             return nb::borrow(self);
           })
      .def(
          "__exit__",
          [](PyPlannedDropHandle& self, nb::handle, nb::handle, nb::handle) {
            nb::gil_scoped_release release;
            self.handle->release();
          },
          nb::arg("exc_type").none(), nb::arg("exc_value").none(), nb::arg("traceback").none());
}

}  // namespace kvcore::py
