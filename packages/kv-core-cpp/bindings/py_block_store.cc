// PyBlockStore: the core's BlockStore calls made on a kv_api.BlockStore, converted as
// kv_core_py's remote tier converts them (operator.index of a count, an Exception a miss).
#include <nanobind/nanobind.h>

#include <limits>

#include "py_objects.h"
#include "python_api.h"

namespace kvcore::py {

namespace {

// The store raised: an Exception is its fault (-1: a miss, counted by the core); anything else
// (KeyboardInterrupt, SystemExit) is the caller's and propagates, as kv_core_py catches only Exception.
std::int64_t store_fault() {
  if (!PyErr_ExceptionMatches(PyExc_Exception)) throw nb::python_error();
  PyErr_Clear();
  return -1;
}

// operator.index(result) (a bool is an int there); -1 where it is no index or out of int64 range.
std::int64_t count_of(PyObject* result) {
  if (result == nullptr) return store_fault();
  PyObject* index = PyNumber_Index(result);
  Py_DECREF(result);
  if (index == nullptr) return store_fault();
  const long long n = PyLong_AsLongLong(index);
  Py_DECREF(index);
  if (n == -1 && PyErr_Occurred()) return store_fault();  // OverflowError: out of range anyway
  return n < 0 ? -1 : static_cast<std::int64_t>(n);
}

// kv_core_py's pause_of: a positive int or float (not a bool) as seconds, an int beyond a
// double's range for ever; 0 for anything else (None, NaN, a negative number, another type).
double pause_of(PyObject* answer) {
  if (PyBool_Check(answer) || !(PyLong_Check(answer) || PyFloat_Check(answer))) return 0;
  const double seconds = PyLong_Check(answer) ? PyLong_AsDouble(answer) : PyFloat_AsDouble(answer);
  if (seconds == -1.0 && PyErr_Occurred()) {  // OverflowError: an int beyond a double's range
    PyErr_Clear();
    const nb::int_ zero(0);
    const int positive = PyObject_RichCompareBool(answer, zero.ptr(), Py_GT);
    if (positive < 0) PyErr_Clear();
    return positive > 0 ? std::numeric_limits<double>::infinity() : 0;
  }
  return seconds > 0 ? seconds : 0;  // NaN > 0 is false
}

nb::list key_list(const std::vector<std::string>& keys) {
  nb::list out;
  for (const std::string& key : keys) out.append(nb::bytes(key.data(), key.size()));
  return out;
}

// kv_api.StoreKeys(namespace, the chained keys concatenated), as kv_core_py's remote tier builds it.
nb::object store_keys(const StoreKeys& keys) {
  return api("StoreKeys")(nb::bytes(keys.ns.data(), keys.ns.size()),
                          nb::bytes(reinterpret_cast<const char*>(keys.keys), keys.size * sizeof(Digest)));
}

}  // namespace

std::int64_t PyBlockStore::contains(const StoreKeys& keys) {
  nb::gil_scoped_acquire acquire;
  nb::object list = store_keys(keys);
  return count_of(PyObject_CallMethod(store_, "contains", "O", list.ptr()));
}

std::int64_t PyBlockStore::get_into(const StoreKeys& keys, const std::vector<ValueBuffer>& buffers) {
  nb::gil_scoped_acquire acquire;
  nb::object list = store_keys(keys);
  nb::list views;
  for (const ValueBuffer& b : buffers) {
    views.append(nb::steal(
        PyMemoryView_FromMemory(reinterpret_cast<char*>(b.data), static_cast<Py_ssize_t>(b.size), PyBUF_WRITE)));
  }
  const std::int64_t n = count_of(PyObject_CallMethod(store_, "get_into", "OO", list.ptr(), views.ptr()));
  // The core frees the buffer: a view the store kept reads as released, never as freed memory.
  for (nb::handle view : views) {
    PyObject* done = PyObject_CallMethod(view.ptr(), "release", nullptr);
    if (done == nullptr) {
      PyErr_Clear();  // exported further (BufferError): nothing more to do
    } else {
      Py_DECREF(done);
    }
  }
  return n;
}

double PyBlockStore::put(const std::vector<std::string>& keys, const std::uint8_t* values, std::size_t value_size) {
  nb::gil_scoped_acquire acquire;
  nb::list list = key_list(keys);
  nb::list value_list;  // bytes made straight from the core's buffer: one copy
  for (std::size_t i = 0; i < keys.size(); ++i)
    value_list.append(nb::bytes(reinterpret_cast<const char*>(values + i * value_size), value_size));
  PyObject* result = PyObject_CallMethod(store_, "put", "OO", list.ptr(), value_list.ptr());
  if (result == nullptr) return static_cast<double>(store_fault());
  const double pause = pause_of(result);
  Py_DECREF(result);
  return pause;
}

}  // namespace kvcore::py
