// Translates kvcore::Error into the kv_api.errors class (or builtin) its kind names.
#include "kvcore/error.h"
#include "python_api.h"
#include "register.h"

namespace kvcore::py {

namespace {

PyObject* python_class(ErrorKind kind) {
  auto api = [](const char* name) { return kv_api().errors.attr(name).ptr(); };
  switch (kind) {
    case ErrorKind::kValue:
      return PyExc_ValueError;
    case ErrorKind::kType:
      return PyExc_TypeError;
    case ErrorKind::kIndex:
      return PyExc_IndexError;
    case ErrorKind::kKey:
      return PyExc_KeyError;
    case ErrorKind::kLogic:
      return api("LogicError");
    case ErrorKind::kInvalidState:
      return api("InvalidStateError");
    case ErrorKind::kOutOfPages:
      return api("OutOfPagesError");
    case ErrorKind::kHostOOM:
      return api("HostOOMError");
    case ErrorKind::kDiskOOM:
      return api("DiskOOMError");
    case ErrorKind::kOS:
      return PyExc_OSError;
    case ErrorKind::kCorrupted:
      return api("CorruptedError");
    case ErrorKind::kNotImplemented:
      return PyExc_NotImplementedError;
    case ErrorKind::kRuntime:
      return PyExc_RuntimeError;
  }
  return PyExc_RuntimeError;
}

}  // namespace

void set_python_error(const Error& e) {
  const bool os_error = e.kind() == ErrorKind::kOS;
  if (!os_error && !e.level()) {
    PyErr_SetString(python_class(e.kind()), e.what());
    return;
  }
  // OSError(errno, strerror) makes the errno's subclass, as Python's os calls raise; a level's
  // error is an instance with `level` set.
  PyObject* type = os_error ? PyExc_OSError : python_class(e.kind());
  PyObject* exc = os_error ? PyObject_CallFunction(type, "is", e.error_number(), e.what())
                           : PyObject_CallFunction(type, "s", e.what());
  if (exc == nullptr) return;  // the call set its own error
  if (e.level()) {
    PyObject* level = PyLong_FromLong(*e.level());
    if (level == nullptr || PyObject_SetAttrString(exc, "level", level) < 0) {
      Py_XDECREF(level);
      Py_DECREF(exc);
      return;
    }
    Py_DECREF(level);
  }
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc)), exc);
  Py_DECREF(exc);
}

void register_errors(nb::module_&) {
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      set_python_error(e);
    }
  });
}

}  // namespace kvcore::py
