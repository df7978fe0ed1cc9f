// KVCache: state checks first, then arguments (as kv_core_py), then kvcore::KVCache without the GIL.
#include "kvcore/kv_cache.h"

#include <nanobind/stl/string.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "bind.h"
#include "kvcore/constants.h"
#include "py_objects.h"
#include "python_api.h"

namespace kvcore::py {

PyKVCache::~PyKVCache() {
  // Closing takes the manager's lock, which a thread waiting for the GIL may hold: close
  // without the GIL, then destroy the (closed) cache with it.
  if (cache && cache->status() != CacheStatus::kClosed && !cache->manager().is_shut_down()) {
    nb::gil_scoped_release release;
    cache->close();
  }
  cache.reset();
  for (auto& [lc, view] : buffers) PyBuffer_Release(&view);
}

namespace {

nb::object status_object(CacheStatus s) { return api("KVCacheStatus")(static_cast<int>(s)); }

nb::object int_array(const std::vector<std::int32_t>& values) {
  nb::object array = nb::module_::import_("array").attr("array")("i");
  array.attr("frombytes")(
      nb::bytes(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(std::int32_t)));
  return array;
}

int group_arg(PyKVCache& self, nb::handle layer_group, nb::handle beam) {
  const std::uint64_t lg = int_at_least("layer_group", layer_group, 0);
  const int n = self.cache->num_layer_groups();
  if (lg >= static_cast<std::uint64_t>(n)) {
    raise(PyExc_IndexError, "layer_group " + str(nb::steal(PyNumber_Index(layer_group.ptr()))) + " out of range (0.." +
                                std::to_string(n - 1) + ")");
  }
  const std::uint64_t b = int_at_least("beam", beam, 0);
  if (b != 0)
    raise(PyExc_IndexError, "beam " + str(nb::steal(PyNumber_Index(beam.ptr()))) + " out of range (beam width 1)");
  return static_cast<int>(lg);
}

std::optional<std::int64_t> length_arg(const char* where, nb::handle value) {
  if (value.is_none()) return std::nullopt;
  return static_cast<std::int64_t>(std::min<std::uint64_t>(int_at_least(where, value, 0), LLONG_MAX));
}

bool resize(PyKVCache& self, nb::handle capacity, nb::handle history_length) {
  self.cache->require(CacheStatus::kActive, "resize");
  const auto cap = length_arg("capacity", capacity);
  const auto hist = length_arg("history_length", history_length);
  nb::gil_scoped_release release;
  return self.cache->resize(cap, hist);
}

void commit(PyKVCache& self, nb::handle tokens, nb::handle is_end) {
  self.cache->require(CacheStatus::kActive, "commit");
  self.cache->require_commit_allowed();
  const TokenList list = token_list(tokens, nb::cast<PyManager&>(self.manager).manager->config().key_format);
  const bool end = PyObject_IsTrue(is_end.ptr()) == 1;
  nb::gil_scoped_release release;
  self.cache->commit(list, end);
}

void set_buffer(PyKVCache& self, nb::handle beam, nb::handle layer_group, nb::handle buf) {
  const int lg = group_arg(self, layer_group, beam);
  if (buf.is_none()) {
    {
      nb::gil_scoped_release release;
      self.cache->set_index_buffer(lg, IndexBuffer{});
    }
    auto it = self.buffers.find(lg);
    if (it != self.buffers.end()) {
      PyBuffer_Release(&it->second);
      self.buffers.erase(it);
    }
    return;
  }
  Py_buffer view;
  if (PyObject_GetBuffer(buf.ptr(), &view, PyBUF_FULL_RO) != 0) {
    PyErr_Clear();
    raise(PyExc_TypeError, "buf: expected a writable int32 buffer, got " + py_type_name(buf));
  }
  const char* fmt = view.format ? view.format : "B";
  const bool int32 =
      !std::strcmp(fmt, "i") || !std::strcmp(fmt, "@i") || !std::strcmp(fmt, "=i") || !std::strcmp(fmt, "<i");
  std::string problem;
  if (view.readonly || view.ndim != 1 || !int32) {
    problem = std::string("buf: must be a writable 1-D buffer of format 'i' (got format ") +
              nb::cast<std::string>(nb::repr(nb::str(fmt))) + ")";
  } else if (!PyBuffer_IsContiguous(&view, 'C')) {
    problem = "buf: must be contiguous";
  }
  if (!problem.empty()) {
    PyBuffer_Release(&view);
    raise(PyExc_ValueError, problem);
  }
  try {
    nb::gil_scoped_release release;
    self.cache->set_index_buffer(
        lg, IndexBuffer{static_cast<std::int32_t*>(view.buf), static_cast<std::size_t>(view.shape[0])});
  } catch (...) {
    PyBuffer_Release(&view);
    throw;
  }
  auto it = self.buffers.find(lg);
  if (it != self.buffers.end()) PyBuffer_Release(&it->second);
  self.buffers[lg] = view;
}

template <typename F>
auto unlocked(F&& f) {
  nb::gil_scoped_release release;
  return f();
}

}  // namespace

void bind_kv_cache(nb::module_& m) {
  nb::class_<PyKVCache>(m, "KVCache")
      .def_prop_ro("manager", [](PyKVCache& self) { return self.manager; })
      .def_prop_ro("id", [](PyKVCache& self) { return self.cache->id(); })
      .def_prop_ro("status", [](PyKVCache& self) { return status_object(self.cache->status()); })
      .def_prop_ro("is_active", [](PyKVCache& self) { return self.cache->status() == CacheStatus::kActive; })
      .def_prop_ro("tokens_per_block", [](PyKVCache& self) { return self.cache->manager().tokens_per_block(); })
      .def_prop_ro("beam_width", [](PyKVCache&) { return 1; })
      .def_prop_ro("reuse_scope", [](PyKVCache& self) { return scope_object(self.cache->reuse_scope()); })
      .def_prop_ro("num_committed_tokens", [](PyKVCache& self) { return self.cache->num_committed_tokens(); })
      .def_prop_ro("committed_tokens", [](PyKVCache& self) { return token_objects(self.cache->committed_tokens()); })
      .def_prop_ro("num_reused_tokens", [](PyKVCache& self) { return self.cache->num_reused_tokens(); })
      .def_prop_ro("num_blocks", [](PyKVCache& self) { return self.cache->num_blocks(); })
      .def_prop_rw(
          "history_length", [](PyKVCache& self) { return self.cache->history_length(); },
          [](PyKVCache& self, nb::handle value) {
            if (!resize(self, nb::none(), value)) {
              raise(kv_api().errors.attr("OutOfPagesError").ptr(), "history_length: not enough pages");
            }
          })
      .def_prop_rw(
          "capacity", [](PyKVCache& self) { return self.cache->capacity(); },
          [](PyKVCache& self, nb::handle value) {
            if (!resize(self, value, nb::none())) {
              raise(kv_api().errors.attr("OutOfPagesError").ptr(), "capacity: not enough pages");
            }
          })
      .def(
          "resume", [](PyKVCache& self, nb::handle) { return unlocked([&] { return self.cache->resume(); }); },
          nb::arg("stream").none() = nb::none())
      .def("suspend", [](PyKVCache& self) { unlocked([&] { self.cache->suspend(); }); })
      .def("resize", &resize, nb::arg("capacity").none() = nb::none(), nb::arg("history_length").none() = nb::none())
      .def("commit", &commit, nb::arg("tokens").none(), nb::arg("is_end") = false)
      .def("stop_committing", [](PyKVCache& self) { unlocked([&] { self.cache->stop_committing(); }); })
      .def("close", [](PyKVCache& self) { unlocked([&] { self.cache->close(); }); })
      .def(
          "get_base_page_indices",
          [](PyKVCache& self, nb::handle layer_group, nb::handle beam) {
            const int lg = group_arg(self, layer_group, beam);
            return int_array(unlocked([&] { return self.cache->base_page_indices(lg); }));
          },
          nb::arg("layer_group"), nb::arg("beam") = 0)
      .def(
          "get_aggregated_page_indices",
          [](PyKVCache& self, nb::handle layer_group, nb::handle beam, nb::handle valid_only) {
            const int lg = group_arg(self, layer_group, beam);
            std::vector<std::int32_t> idx = unlocked([&] { return self.cache->base_page_indices(lg); });
            if (PyObject_IsTrue(valid_only.ptr()) == 1)
              idx.erase(std::remove(idx.begin(), idx.end(), kBadPageIndex), idx.end());
            return int_array(idx);
          },
          nb::arg("layer_group"), nb::arg("beam") = 0, nb::arg("valid_only") = false)
      .def("set_base_page_index_buf", &set_buffer, nb::arg("beam"), nb::arg("layer_group"), nb::arg("buf").none());
}

}  // namespace kvcore::py
