// KVCacheEventManager: arguments checked (arguments.h) as kv_core_py's, events converted to
// kv_api.events.
#include <nanobind/stl/string.h>

#include <variant>

#include "arguments.h"
#include "kvcore/event_hash.h"
#include "kvcore/poison.h"
#include "py_objects.h"
#include "python_api.h"
#include "register.h"

namespace kvcore::py {

namespace {

nb::object hash_object(const BlockHash& h) {
  if (const auto* s = std::get_if<std::string>(&h)) return nb::str(s->c_str());
  return nb::steal(PyLong_FromUnsignedLongLong(std::get<std::uint64_t>(h)));
}

// kv_api.events' classes, looked up once per drain: a drain makes one object per token.
struct EventClasses {
  nb::object created = api("events.Created");
  nb::object stored = api("events.Stored");
  nb::object stored_block = api("events.StoredBlock");
  nb::object unique_token = api("events.UniqueToken");
  nb::object removed = api("events.Removed");
  nb::object diff = api("events.Diff");
  nb::object updated = api("events.Updated");
  nb::object event = api("events.KVCacheEvent");
};

nb::object stored_object(const Event& e, const EventClasses& cls) {
  nb::list blocks;
  for (const StoredBlockEvent& b : e.blocks) {
    nb::list tokens;
    std::size_t d = 0;
    for (std::size_t i = 0; i < b.tokens.size(); ++i) {
      nb::object id;
      if (d < b.tokens.digests.size() && b.tokens.digests[d].position == i) {
        const Digest& digest = b.tokens.digests[d++].digest;
        id = nb::str(block_hash_v2_sha256(digest).c_str());  // a digest token as its hex
      } else {
        id = nb::steal(PyLong_FromUnsignedLongLong(b.tokens.ids[i]));
      }
      tokens.append(cls.unique_token(id));
    }
    // (block_hash, tokens, cache_level, priority, mm_keys, cache_salt, lora_id)
    nb::object lora = b.lora_id ? nb::steal(PyLong_FromUnsignedLongLong(*b.lora_id)) : nb::none();
    blocks.append(cls.stored_block(hash_object(b.block_hash), nb::tuple(tokens), b.cache_level, b.priority, nb::tuple(),
                                   nb::none(), lora));
  }
  return cls.stored(e.parent_hash ? hash_object(*e.parent_hash) : nb::none(), nb::tuple(blocks));
}

nb::object event_object(const Event& e, const char* algo, const EventClasses& cls) {
  nb::object data;
  switch (e.kind) {
    case Event::Kind::kCreated: {
      nb::list levels;
      for (std::uint64_t n : e.num_blocks_per_cache_level) levels.append(n);
      data = cls.created(nb::tuple(levels));
      break;
    }
    case Event::Kind::kStored:
      data = stored_object(e, cls);
      break;
    case Event::Kind::kRemoved: {
      nb::list hashes;
      for (const BlockHash& h : e.block_hashes) hashes.append(hash_object(h));
      data = cls.removed(nb::tuple(hashes));
      break;
    }
    case Event::Kind::kUpdated: {
      nb::object diff = cls.diff(e.cache_level.first, e.cache_level.second);
      data = cls.updated(hash_object(e.block_hashes.at(0)), diff);
      break;
    }
  }
  return cls.event(e.id, data, optional_int(e.window_size), algo, nb::none(),
                   optional_int(e.layer_group_id ? std::optional<std::int64_t>(*e.layer_group_id) : std::nullopt));
}

void init(PyEventManager* self, nb::handle max_entries, nb::handle hash_algo) {
  poison::check();  // before the arguments, as every call orders it
  // kv_core_py.event_manager.check_event_args' order.
  const std::int64_t n = arg::event_entries(max_entries);
  const HashAlgo algo = arg::hash_algo(hash_algo);
  new (self) PyEventManager{std::make_unique<KVCacheEventManager>(n, algo)};
}

nb::list latest(PyEventManager& self, nb::handle timeout_ms) {
  poison::check();  // before the timeout, which is checked before the core is called
  const double timeout = arg::timeout_ms(timeout_ms);
  std::vector<Event> events;
  {
    nb::gil_scoped_release release;
    events = self.events->get_latest_events(timeout);
  }
  nb::list out;
  const char* algo = hash_algo_name(self.events->hash_algo());
  const EventClasses classes;
  for (const Event& e : events) out.append(event_object(e, algo, classes));
  return out;
}

}  // namespace

void register_event_manager(nb::module_& m) {
  nb::class_<PyEventManager>(m, "KVCacheEventManager")
      .def("__init__", &init, nb::arg("max_kv_event_entries").none() = 1000, nb::arg("hash_algo").none() = "v2_sha256")
      // Fixed at construction and read in place, so they check the poison latch themselves.
      .def_prop_ro("hash_algo",
                   [](PyEventManager& self) {
                     poison::check();
                     return std::string(hash_algo_name(self.events->hash_algo()));
                   })
      .def_prop_ro("max_kv_event_entries",
                   [](PyEventManager& self) {
                     poison::check();
                     return self.events->max_kv_event_entries();
                   })
      .def_prop_ro("dropped_events",
                   [](PyEventManager& self) {
                     nb::gil_scoped_release release;
                     return self.events->dropped_events();
                   })
      .def("flush_iteration_events",
           [](PyEventManager& self) {
             nb::gil_scoped_release release;
             self.events->flush_iteration_events();
           })
      .def("get_latest_events", &latest, nb::arg("timeout_ms").none() = 0);
}

}  // namespace kvcore::py
