// Block keys and event hash forms; arguments checked (arguments.h) in kv_api.keys' order.
#include <nanobind/stl/string.h>

#include <memory>
#include <string>
#include <vector>

#include "arguments.h"
#include "kvcore/block_keys.h"
#include "kvcore/constants.h"
#include "kvcore/event_hash.h"
#include "python_api.h"
#include "register.h"
#include "token_input.h"

namespace kvcore::py {

namespace {

// Hashing more tokens than this runs without the GIL; below it the release costs more.
constexpr std::size_t kReleaseGilTokens = 4096;

struct KeyArgs {
  std::size_t tokens_per_block;
  ReuseScope scope;
  KeyFormat format;
};

KeyArgs key_args(nb::handle tokens_per_block_arg, nb::handle scope, nb::handle format) {
  const std::uint64_t tokens_per_block = arg::int_at_least("tokens_per_block", tokens_per_block_arg, 1);
  const ReuseScope s = arg::reuse_scope(scope);
  return {static_cast<std::size_t>(tokens_per_block), s, arg::key_format(format)};
}

nb::bytes digest_bytes(const Digest& d) { return nb::bytes(reinterpret_cast<const char*>(d.data()), d.size()); }

nb::bytes py_block_keys(nb::handle tokens_per_block, nb::handle scope, nb::handle tokens, nb::handle format) {
  const KeyArgs args = key_args(tokens_per_block, scope, format);
  TokenInput input(tokens, args.format);
  const Tokens& t = input.tokens();
  const std::size_t size = 32 * (1 + ceil_div(t.count, args.tokens_per_block));
  nb::object out = nb::steal(PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(size)));
  if (!out.is_valid()) throw nb::python_error();
  auto* dst = reinterpret_cast<std::uint8_t*>(PyBytes_AS_STRING(out.ptr()));
  if (t.count > kReleaseGilTokens) {
    nb::gil_scoped_release release;
    block_keys(args.tokens_per_block, args.scope, t, args.format, dst);
  } else {
    block_keys(args.tokens_per_block, args.scope, t, args.format, dst);
  }
  return nb::borrow<nb::bytes>(out);
}

// kv_api.keys.named_item: runs `check`; a plain TypeError or ValueError it raises is raised
// again, same class, as "where[index]: message" (chained from it); anything else passes through.
template <typename F>
auto named_item(const char* where, std::size_t index, F&& check) -> decltype(check()) {
  try {
    return check();
  } catch (nb::python_error& e) {
    PyObject* type = e.type().ptr();
    if (type != PyExc_TypeError && type != PyExc_ValueError) throw;
    const std::string text = std::string(where) + "[" + std::to_string(index) + "]: " + nb::str(e.value()).c_str();
    nb::raise_from(e, type, "%s", text.c_str());
  }
}

std::size_t sequence_size(nb::handle seq) {
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.ptr());  // an exact list or tuple
  return static_cast<std::size_t>(n);
}

// The order of kv_api.keys.block_keys_many: tokens_per_block, reuse_scopes (the list, then each
// item), key_format, token_inputs (the list, its length, then each input). All before hashing.
nb::list py_block_keys_many(nb::handle tokens_per_block_arg, nb::handle scopes, nb::handle inputs, nb::handle format) {
  const std::uint64_t tokens_per_block = arg::int_at_least("tokens_per_block", tokens_per_block_arg, 1);
  const bool one_scope = scopes.is_none();
  std::vector<ReuseScope> scope_list;
  if (!one_scope) {
    if (!PyList_Check(scopes.ptr()) && !PyTuple_Check(scopes.ptr()))
      fail(PyExc_TypeError, msg::kExpectedScopeList, {py_type_name(scopes)});
    // A copy: the items are Python objects a scope's checks may run code on (__index__).
    nb::object items = nb::steal(PySequence_Tuple(scopes.ptr()));
    if (!items.is_valid()) throw nb::python_error();
    for (std::size_t i = 0; i < sequence_size(items); ++i) {
      nb::handle item = PyTuple_GET_ITEM(items.ptr(), static_cast<Py_ssize_t>(i));
      scope_list.push_back(named_item("reuse_scopes", i, [&] { return arg::reuse_scope(item); }));
    }
  }
  const KeyFormat fmt = arg::key_format(format);
  if (!PyList_Check(inputs.ptr()) && !PyTuple_Check(inputs.ptr()))
    fail(PyExc_TypeError, msg::kExpectedTokenInputs, {py_type_name(inputs)});
  nb::object items = nb::steal(PySequence_Tuple(inputs.ptr()));
  if (!items.is_valid()) throw nb::python_error();
  const std::size_t count = sequence_size(items);
  if (!one_scope && scope_list.size() != count)
    fail(PyExc_ValueError, msg::kTokenInputsCount, {std::to_string(count), std::to_string(scope_list.size())});
  std::vector<std::unique_ptr<TokenInput>> read;
  read.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    nb::handle item = PyTuple_GET_ITEM(items.ptr(), static_cast<Py_ssize_t>(i));
    read.push_back(named_item("token_inputs", i, [&] { return std::make_unique<TokenInput>(item, fmt); }));
  }

  nb::list out;
  std::vector<KeyChainInput> chains;
  chains.reserve(count);
  std::size_t total = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const Tokens& t = read[i]->tokens();
    const std::size_t size = 32 * (1 + ceil_div(t.count, static_cast<std::size_t>(tokens_per_block)));
    nb::object keys = nb::steal(PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(size)));
    if (!keys.is_valid()) throw nb::python_error();
    chains.push_back(
        {one_scope ? ReuseScope{} : scope_list[i], &t, reinterpret_cast<std::uint8_t*>(PyBytes_AS_STRING(keys.ptr()))});
    out.append(keys);
    total += t.count;
  }
  if (total > kReleaseGilTokens) {
    nb::gil_scoped_release release;
    block_keys_many(static_cast<std::size_t>(tokens_per_block), chains.data(), chains.size(), fmt);
  } else {
    block_keys_many(static_cast<std::size_t>(tokens_per_block), chains.data(), chains.size(), fmt);
  }
  return out;
}

nb::object token_object(const Tokens& t, std::size_t i, std::size_t& digest) {
  if (digest < t.digests.size() && t.digests[digest].position == i) return digest_bytes(t.digests[digest++].digest);
  nb::object id = nb::steal(PyLong_FromUnsignedLongLong(t.raw(i)));
  if (!id.is_valid()) throw nb::python_error();
  return id;
}

// The lazy iterator behind sequence_to_blockchain_keys: yields (block tokens, key).
class PyBlockKeyIterator {
 public:
  PyBlockKeyIterator(BlockKeyIterator it, nb::object items) : it_(std::move(it)), items_(std::move(items)) {}

  nb::tuple next() {
    if (it_.done()) throw nb::stop_iteration();
    std::size_t begin, end;
    const Digest key = it_.next(begin, end);
    return nb::make_tuple(block(begin, end), digest_bytes(key));
  }

 private:
  // Tokens [begin, end) as a list: sliced from the kept items (no new ints), else built.
  nb::list block(std::size_t begin, std::size_t end) {
    const auto b = static_cast<Py_ssize_t>(begin);
    PyObject* out = items_.is_valid() ? PyList_GetSlice(items_.ptr(), b, static_cast<Py_ssize_t>(end))
                                      : PyList_New(static_cast<Py_ssize_t>(end - begin));
    if (!out) throw nb::python_error();
    nb::list tokens = nb::steal<nb::list>(out);
    if (items_.is_valid()) return tokens;
    // Sized once and filled in place (a list with items still NULL is freed safely on a throw).
    for (std::size_t i = begin; i < end; ++i)
      PyList_SET_ITEM(out, static_cast<Py_ssize_t>(i) - b, token_object(it_.tokens(), i, digest_).release().ptr());
    return tokens;
  }

  BlockKeyIterator it_;
  nb::object items_;        // a copy of the caller's plain ints (a list), when it gave them
  std::size_t digest_ = 0;  // cursor into the tokens' digests, for building block lists
};

PyBlockKeyIterator py_sequence_to_blockchain_keys(nb::handle tokens_per_block, nb::handle scope, nb::handle tokens,
                                                  nb::handle format) {
  const KeyArgs args = key_args(tokens_per_block, scope, format);
  // The iterator may outlive the caller's buffer, so it keeps its own copy of the ids; of a
  // list or tuple of plain ints it also keeps the items, so that block lists are slices of them
  // (no new ints), as in the Python backend. The items are copied first: the copy's allocation
  // may run the garbage collector (Python code), reading them runs none, so when the read finds
  // only plain ints the copy holds exactly the ids read.
  nb::object items;
  if (PyList_CheckExact(tokens.ptr()) || PyTuple_CheckExact(tokens.ptr())) {
    items = nb::steal(PySequence_List(tokens.ptr()));
    if (!items.is_valid()) throw nb::python_error();
  }
  TokenInput input(tokens, args.format);
  if (!input.plain_sequence() || (items.is_valid() && sequence_size(items) != input.tokens().count)) items.reset();
  return PyBlockKeyIterator(
      BlockKeyIterator(args.tokens_per_block, args.scope, input.tokens().to_owned(args.format), args.format),
      std::move(items));
}

nb::bytes py_reuse_scope_to_bytes(nb::handle scope) {
  const std::vector<std::uint8_t> b = reuse_scope_to_bytes(arg::reuse_scope(scope));
  return nb::bytes(reinterpret_cast<const char*>(b.data()), b.size());
}

nb::list py_gen_multimodal_cache_key_tokens(nb::handle id_offset, nb::handle digest, nb::handle num_tokens,
                                            nb::handle token_offset, nb::handle uuid) {
  // kv_api.keys.check_mm_item's ranges, left to right, before any work: a count beyond
  // TOKEN_LIMIT is refused, not built.
  const std::uint64_t offset = arg::u64("id_offset", id_offset);
  arg::digest("digest", digest);
  const std::int64_t n = arg::int_between("num_tokens", num_tokens, 1, kTokenLimit);
  const std::int64_t start = arg::int_between("token_offset", token_offset, 0, kTokenLimit);
  // Built whether or not token_offset leaves the digest out, so a bad uuid always fails.
  nb::object first = uuid.is_none() ? nb::borrow(digest) : kv_api().mm_item_context(digest, uuid);
  // Python ints: id_offset + token_offset + i may pass 2**64, and the reference's values are ints.
  nb::object base = nb::steal(PyNumber_Add(nb::int_(offset).ptr(), nb::int_(start).ptr()));
  if (!base.is_valid()) throw nb::python_error();
  nb::list out;
  for (std::int64_t i = 0; i < n; ++i) {
    if (i == 0 && start == 0) {
      out.append(first);
    } else {
      nb::object id = nb::steal(PyNumber_Add(base.ptr(), nb::int_(i).ptr()));
      if (!id.is_valid()) throw nb::python_error();
      out.append(id);
    }
  }
  return out;
}

}  // namespace

// Every argument of the contract's functions is declared .none(), so that None meets the
// checkers (arguments.h) in kv_api.keys' order rather than nanobind's own TypeError.
void register_keys(nb::module_& m) {
  const auto default_format = nb::str(key_format_name(kDefaultKeyFormat));
  m.def("block_keys", &py_block_keys, nb::arg("tokens_per_block").none(), nb::arg("reuse_scope").none(),
        nb::arg("tokens").none(), nb::arg("key_format").none() = default_format,
        "The chained keys of ``tokens``, root first, concatenated (32 bytes each).");
  nb::class_<PyBlockKeyIterator>(m, "BlockKeyIterator")
      .def("__iter__", [](nb::handle self) { return self; })
      .def("__next__", &PyBlockKeyIterator::next);
  m.def("sequence_to_blockchain_keys", &py_sequence_to_blockchain_keys, nb::arg("tokens_per_block").none(),
        nb::arg("reuse_scope").none(), nb::arg("tokens").none(), nb::arg("key_format").none() = default_format,
        "Yield ``([], root_key)`` then ``(block_tokens, block_key)`` per block; validates now, hashes lazily.");
  m.def("block_keys_many", &py_block_keys_many, nb::arg("tokens_per_block").none(), nb::arg("reuse_scopes").none(),
        nb::arg("token_inputs").none(), nb::arg("key_format").none() = default_format,
        "``block_keys`` of each input, independent chains hashed four at a time (interleaved).");
  m.def("reuse_scope_to_bytes", &py_reuse_scope_to_bytes, nb::arg("reuse_scope").none());
  m.def("gen_multimodal_cache_key_tokens", &py_gen_multimodal_cache_key_tokens, nb::arg("id_offset").none(),
        nb::arg("digest").none(), nb::arg("num_tokens").none(), nb::arg("token_offset").none() = 0,
        nb::arg("uuid").none() = nb::none());
  m.def(
      "cache_salt_to_id", [](nb::handle salt) { return cache_salt_to_id(arg::str("cache_salt", salt)); },
      nb::arg("cache_salt").none());
  m.def(
      "block_hash_v2_sha256", [](nb::handle key) { return block_hash_v2_sha256(arg::digest("key", key)); },
      nb::arg("key").none());
  m.def(
      "block_hash_v2_sha256_64", [](nb::handle key) { return block_hash_v2_sha256_64(arg::digest("key", key)); },
      nb::arg("key").none());
  m.def(
      "block_hash_v1",
      [](nb::handle tokens, nb::handle parent_hash, nb::handle scope) {
        const ReuseScope s = arg::reuse_scope(scope);
        const std::uint64_t parent = arg::u64("parent_hash", parent_hash);
        TokenInput input(tokens, KeyFormat::kU64);
        if (!input.tokens().digests.empty()) {
          fail(PyExc_ValueError, msg::kNoV1Form, {std::to_string(input.tokens().digests[0].position)});
        }
        return block_hash_v1(input.tokens(), parent, s);
      },
      nb::arg("tokens").none(), nb::arg("parent_hash").none(), nb::arg("reuse_scope").none() = nb::none());
  m.def(
      "sha256",
      [](nb::bytes data) {
        return digest_bytes(sha256_digest(reinterpret_cast<const std::uint8_t*>(data.c_str()), data.size()));
      },
      nb::arg("data"), "SHA-256 of ``data`` through the active transform (for known-answer tests).");
}

}  // namespace kvcore::py
