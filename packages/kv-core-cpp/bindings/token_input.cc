#include "token_input.h"

#include <cstring>
#include <string>

#include "arguments.h"
#include "python_api.h"

namespace kvcore::py {

namespace {

bool native_order(char order) {
  return order == '@' || order == '=' || order == '<';  // little-endian only (see sha256.cc)
}

[[noreturn]] void out_of_range(std::size_t position, nb::handle value, KeyFormat format) {
  raise(PyExc_ValueError, token_out_of_range(position, str(value), format));
}

}  // namespace

TokenInput::TokenInput(nb::handle tokens, KeyFormat format) {
  PyObject* obj = tokens.ptr();
  if (PyList_CheckExact(obj) || PyTuple_CheckExact(obj)) {
    pack_sequence(tokens, format);
  } else if (PyObject_CheckBuffer(obj)) {
    view_buffer(tokens, format);
  } else if (PyUnicode_Check(obj) || PyDict_Check(obj)) {
    fail(PyExc_TypeError, msg::kExpectedTokens, {py_type_name(tokens)});
  } else {
    pack_iterable(tokens, format);
  }
  tokens_.data = export_.held ? tokens_.data : tokens_.owned.data();
}

void TokenInput::view_buffer(nb::handle obj, KeyFormat format) {
  Py_buffer& view_ = export_.view;
  if (PyObject_GetBuffer(obj.ptr(), &view_, PyBUF_FULL_RO) != 0) throw nb::python_error();
  export_.held = true;
  // As kv_api.keys.buffer_int_code: decide from the kind and the item size together.
  const char* fmt = view_.format ? view_.format : "B";
  const char order = std::strchr("@=<>!", fmt[0]) && fmt[0] ? fmt[0] : '@';
  const char* letter = order == fmt[0] ? fmt + 1 : fmt;
  if (view_.ndim != 1) {
    fail(PyExc_TypeError, msg::kTokenBufferDims, {std::to_string(view_.ndim)});
  }
  const bool integer = std::strlen(letter) == 1 && std::strchr("bBhHiIlLqQnN", letter[0]);
  if (!integer || (view_.itemsize != 4 && view_.itemsize != 8) || !native_order(order)) {
    fail(PyExc_TypeError, msg::kTokenBufferFormat, {py_repr(nb::str(fmt)), std::to_string(view_.itemsize)});
  }
  tokens_.data = static_cast<const std::uint8_t*>(view_.buf);
  tokens_.count = static_cast<std::size_t>(view_.shape[0]);
  tokens_.stride = view_.strides ? view_.strides[0] : view_.itemsize;
  tokens_.width = static_cast<std::uint8_t>(view_.itemsize);
  tokens_.is_signed = letter[0] >= 'a';
  tokens_.validate(format);
}

void TokenInput::store_id(std::size_t position, std::uint64_t id, KeyFormat format) {
  const std::size_t width = token_width(format);
  if (tokens_.owned.size() < (position + 1) * width) tokens_.owned.resize((position + 1) * width);
  std::memcpy(tokens_.owned.data() + position * width, &id, width);  // little-endian: the low bytes
}

namespace {

// The value of a non-negative exact int below 2**60 read without a call, else false (negative
// or larger ints take the general path). Reads CPython's int layout: the public unstable API
// from 3.12, the 30-bit digits before.
bool small_id(PyObject* item, std::uint64_t& id) {
#if PY_VERSION_HEX >= 0x030C0000
  auto* v = reinterpret_cast<PyLongObject*>(item);
  if (!PyUnstable_Long_IsCompact(v)) return false;
  const Py_ssize_t x = PyUnstable_Long_CompactValue(v);
  id = static_cast<std::uint64_t>(x);
  return x >= 0;
#else
  const Py_ssize_t size = Py_SIZE(item);
  const digit* d = reinterpret_cast<PyLongObject*>(item)->ob_digit;
  if (size < 0 || size > 2) return false;
  id = size == 0 ? 0 : size == 1 ? d[0] : d[0] | static_cast<std::uint64_t>(d[1]) << PyLong_SHIFT;
  return true;
#endif
}

}  // namespace

void TokenInput::pack_sequence(nb::handle seq, KeyFormat format) {
  PyObject* obj = seq.ptr();
  tokens_.width = static_cast<std::uint8_t>(token_width(format));
  tokens_.stride = tokens_.width;
  tokens_.owned.reserve(static_cast<std::size_t>(PySequence_Fast_GET_SIZE(obj)) * tokens_.width);
  const std::uint64_t limit = format == KeyFormat::kU32 ? (1ull << 31) : ~0ull;
  // As a Python loop over the list: the general path may run Python code (__index__) that
  // grows, shrinks or rewrites the list, so its size is re-read each step and the item is held
  // while that code runs.
  Py_ssize_t i = 0;
  for (; i < PySequence_Fast_GET_SIZE(obj); ++i) {
    nb::object item = nb::borrow(PySequence_Fast_GET_ITEM(obj, i));
    std::uint64_t id;
    if (PyLong_CheckExact(item.ptr()) && small_id(item.ptr(), id) && id < limit) {
      store_id(static_cast<std::size_t>(i), id, format);
    } else {
      push(static_cast<std::size_t>(i), item, format);  // the general rules decide
    }
  }
  tokens_.owned.resize(static_cast<std::size_t>(i) * tokens_.width);  // a list that shrank
  tokens_.count = static_cast<std::size_t>(i);
}

void TokenInput::pack_iterable(nb::handle obj, KeyFormat format) {
  // kv_api.keys.token_list's test, isinstance(tokens, Iterable): a type without __iter__ (None
  // included) is our TypeError. One with __iter__ is iterated, and what its __iter__ raises
  // propagates unchanged, as Python's own iteration does (docs/errors.md, "Tokens").
  const int is_iterable = PyObject_IsInstance(obj.ptr(), kv_api().iterable.ptr());
  if (is_iterable < 0) throw nb::python_error();
  if (!is_iterable) fail(PyExc_TypeError, msg::kExpectedTokens, {py_type_name(obj)});
  nb::object it = nb::steal(PyObject_GetIter(obj.ptr()));
  if (!it.is_valid()) throw nb::python_error();
  tokens_.width = static_cast<std::uint8_t>(token_width(format));
  tokens_.stride = tokens_.width;
  std::size_t position = 0;
  while (true) {
    nb::object item = nb::steal(PyIter_Next(it.ptr()));
    if (!item.is_valid()) {
      if (PyErr_Occurred()) throw nb::python_error();
      break;
    }
    push(position++, item, format);
  }
  tokens_.count = tokens_.owned.size() / tokens_.width;
}

void TokenInput::push(std::size_t position, nb::handle item, KeyFormat format) {
  // The order of these rules is kv_api.keys._normalise's.
  if (PyBytes_Check(item.ptr())) {
    const Py_ssize_t size = PyBytes_GET_SIZE(item.ptr());
    if (size != 32) {
      fail(PyExc_ValueError, msg::kDigestTokenSize, {std::to_string(position), std::to_string(size)});
    }
    DigestToken d{position, {}};
    std::memcpy(d.digest.data(), PyBytes_AS_STRING(item.ptr()), 32);
    tokens_.digests.push_back(d);
    store_id(position, 0, format);  // placeholder, skipped by the hasher
    return;
  }
  if (nb::isinstance(item, kv_api().mm_item_context)) {
    push(position, item.attr("digest"), format);
    return;
  }
  if (PyBool_Check(item.ptr())) fail(PyExc_TypeError, msg::kBoolToken, {std::to_string(position)});
  if (!PyIndex_Check(item.ptr())) {
    fail(PyExc_TypeError, msg::kExpectedToken, {std::to_string(position), py_type_name(item)});
  }
  nb::object index = nb::steal(PyNumber_Index(item.ptr()));
  if (!index.is_valid()) throw nb::python_error();
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  std::uint64_t id = static_cast<std::uint64_t>(v);
  if (overflow < 0 || (overflow == 0 && v < 0)) out_of_range(position, index, format);
  if (overflow > 0) {
    id = PyLong_AsUnsignedLongLong(index.ptr());
    if (PyErr_Occurred()) {
      PyErr_Clear();
      out_of_range(position, index, format);
    }
  }
  if (format == KeyFormat::kU32 && id >= (1ull << 31)) out_of_range(position, index, format);
  store_id(position, id, format);
}

}  // namespace kvcore::py
