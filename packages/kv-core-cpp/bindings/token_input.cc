#include "token_input.h"

#include <cstring>
#include <string>

#include "arguments.h"
#include "kvcore/prefetch.h"
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

// The id held by `item` when it is an exact int in [0, limit), else false (bools, int-likes,
// negative or larger ints take the general path, which produces the errors). Runs no Python
// code and sets no exception: an exact int has no __index__ to call, and an overflow is a flag.
inline bool small_id(PyObject* item, std::uint64_t limit, std::uint64_t& id) noexcept {
  if (!PyLong_CheckExact(item)) return false;
#if PY_VERSION_HEX >= 0x030C0000
  // Public unstable API: values below 2**30 without a call.
  auto* v = reinterpret_cast<PyLongObject*>(item);
  if (PyUnstable_Long_IsCompact(v)) {
    const Py_ssize_t x = PyUnstable_Long_CompactValue(v);
    id = static_cast<std::uint64_t>(x);
    return x >= 0 && id < limit;
  }
#endif
#if PY_VERSION_HEX < 0x030C0000
  // Before 3.12: up to two 30-bit digits, sign in the size (cpython/longintrepr.h). Branch-free
  // over the digit count: ids either side of 2**30 mix at random, and a mispredicted branch per
  // item cost twice the rest of the read. Every int has room for digit 0 (_PyLong_New allocates
  // at least one); digit 1 is only read when there are two.
  const Py_ssize_t size = Py_SIZE(item);
  if (size >= 0 && size <= 2) {
    const digit* d = reinterpret_cast<PyLongObject*>(item)->ob_digit;
    const std::uint64_t lo = d[0] & (0 - static_cast<std::uint64_t>(size != 0));
    const std::uint64_t hi = d[size >> 1] & (0 - static_cast<std::uint64_t>(size == 2));
    id = lo | hi << PyLong_SHIFT;
    return id < limit;
  }
#endif
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(item, &overflow);
  id = static_cast<std::uint64_t>(x);
  return overflow == 0 && x >= 0 && id < limit;
}

// Reading the int objects, not converting them, is the cost. Adjacent ones (a list built in one
// go) the hardware prefetcher follows; for scattered ones (a shuffled million-int list: 27 -> 13
// ns per item) the loop asks for the objects some items ahead.
constexpr Py_ssize_t kPrefetchItems = 32;

// Stores items [begin, end) of an exact list or tuple into `out` while they are small exact
// ints; returns the index of the first that is not (or end). No Python code runs in here, so
// the sequence cannot change under it and its items need no references of their own.
template <typename T>
Py_ssize_t store_small_ids(PyObject* seq, Py_ssize_t begin, Py_ssize_t end, std::uint64_t limit,
                           std::uint8_t* out) noexcept {
  PyObject** items = PySequence_Fast_ITEMS(seq);
  for (Py_ssize_t i = begin; i < end; ++i) {
    if (i + kPrefetchItems < end) prefetch(items[i + kPrefetchItems]);
    std::uint64_t id;
    if (!small_id(items[i], limit, id)) return i;
    const T v = static_cast<T>(id);                                             // < limit: fits T
    std::memcpy(out + static_cast<std::size_t>(i) * sizeof(T), &v, sizeof(T));  // little-endian
  }
  return end;
}

}  // namespace

void TokenInput::pack_sequence(nb::handle seq, KeyFormat format) {
  PyObject* obj = seq.ptr();
  const std::size_t width = token_width(format);
  tokens_.width = static_cast<std::uint8_t>(width);
  tokens_.stride = tokens_.width;
  const std::uint64_t limit = format == KeyFormat::kU32 ? (1ull << 31) : ~0ull;
  // As a Python loop over the list: the general path may run Python code (__index__) that
  // grows, shrinks or rewrites the list, so after it the size (and the item array) is read
  // again, and the item is held while that code runs. Between such items the fast loop reads
  // the item array directly.
  Py_ssize_t i = 0;
  bool general = false;
  while (i < PySequence_Fast_GET_SIZE(obj)) {
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(obj);
    if (tokens_.owned.size() < static_cast<std::size_t>(n) * width)
      tokens_.owned.resize(static_cast<std::size_t>(n) * width);
    i = width == 4 ? store_small_ids<std::uint32_t>(obj, i, n, limit, tokens_.owned.data())
                   : store_small_ids<std::uint64_t>(obj, i, n, limit, tokens_.owned.data());
    if (i == n) break;
    nb::object item = nb::borrow(PySequence_Fast_GET_ITEM(obj, i));
    push(static_cast<std::size_t>(i), item, format);  // the general rules decide
    general = true;
    ++i;
  }
  tokens_.owned.resize(static_cast<std::size_t>(i) * width);  // a list that shrank
  tokens_.count = static_cast<std::size_t>(i);
  plain_sequence_ = !general;
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
