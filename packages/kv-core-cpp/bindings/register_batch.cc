// Batched calls (kvcore/batch.h; as kv_core_py.batch): every argument is checked and converted
// with the GIL held, then the core runs the whole batch without it, in one crossing. A failing
// call's exception is the single call's, with a note and the batch_index / batch_results
// attributes (docs/manager.md, "Batched calls").
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "arguments.h"
#include "kvcore/batch.h"
#include "kvcore/constants.h"
#include "kvcore/error.h"
#include "py_objects.h"
#include "python_api.h"
#include "register.h"
#include "token_input.h"

namespace kvcore::py {

namespace {

// A list or tuple, copied to a tuple first: what an item's __index__ does to the caller's list
// afterwards changes nothing here (kv_core_py takes the same snapshot).
nb::tuple items(const char* where, nb::handle value) {
  if (!PyList_Check(value.ptr()) && !PyTuple_Check(value.ptr())) {
    fail(PyExc_TypeError, msg::kExpectedItems, {where, py_type_name(value)});
  }
  return nb::steal<nb::tuple>(PySequence_Tuple(value.ptr()));
}

void same_length(const char* where, std::size_t size, const char* first, std::size_t n) {
  if (size != n) fail(PyExc_ValueError, msg::kItemsFor, {where, std::to_string(size), std::to_string(n), first});
}

// The exception `error` holds as the Python error a single call raises (a kvcore::Error as the
// translator in register_errors.cc sets it); nullopt for one nanobind translates itself.
std::optional<nb::python_error> as_python_error(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (nb::python_error& e) {
    e.restore();
  } catch (const Error& e) {
    set_python_error(e);
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
  } catch (...) {
    return std::nullopt;
  }
  return nb::python_error();
}

// Runs `check` (the conversion of one item); its error gets a note naming the item.
template <typename Check>
auto item(const char* api, const char* name, std::size_t i, Check&& check) {
  try {
    return check();
  } catch (...) {
    std::optional<nb::python_error> error = as_python_error(std::current_exception());
    if (!error) throw;
    error->value().attr("add_note")(std::string(api) + ": in " + name + "[" + std::to_string(i) + "]; nothing changed");
    throw std::move(*error);
  }
}

// caches[i]: one of this manager's caches.
KVCache* cache_arg(nb::handle manager, nb::handle cache, std::size_t i) {
  // The item's name is only built for an error: a batch converts every item on every call.
  const auto where = [i] { return "caches[" + std::to_string(i) + "]"; };
  // The exact type is compared first: nanobind's check looks the type up on every call.
  static const nb::handle exact = nb::type<PyKVCache>();
  if (!Py_IS_TYPE(cache.ptr(), reinterpret_cast<PyTypeObject*>(exact.ptr())) && !nb::isinstance<PyKVCache>(cache)) {
    fail(PyExc_TypeError, msg::kExpectedCache, {where(), py_type_name(cache)});
  }
  PyKVCache& c = *nb::inst_ptr<PyKVCache>(cache);
  if (!c.manager.is(manager)) fail(PyExc_ValueError, msg::kOtherManager, {where()});
  return c.cache.get();
}

// counts[i]: an exact int in range is read straight; anything else (and every error) goes the
// general way, which names the item.
std::size_t count_arg(nb::handle value, std::size_t i) {
  if (long long v; arg::exact_int(value, v) && v >= 0 && v < kTokenLimit) return static_cast<std::size_t>(v);
  const std::string where = "counts[" + std::to_string(i) + "]";
  return static_cast<std::size_t>(arg::int_between(where.c_str(), value, 0, kTokenLimit));
}

// The failing call's exception as the single call raised it, with where the batch stopped (and
// `note` after, where not empty).
[[noreturn]] void raise_failure(const BatchFailure& failure, const char* api, std::size_t n, nb::handle results,
                                const std::string& note = {}) {
  std::optional<nb::python_error> error = as_python_error(failure.error);
  if (!error) std::rethrow_exception(failure.error);
  const std::size_t k = failure.index;
  error->value().attr("add_note")(std::string(api) + ": call " + std::to_string(k) + " of " + std::to_string(n) +
                                  " raised this; the " + std::to_string(k) + " before it took effect, it and the " +
                                  std::to_string(n - k - 1) + " after it did not");
  error->value().attr("batch_index") = k;
  error->value().attr("batch_results") = results;
  if (!note.empty()) error->value().attr("add_note")(note);
  throw std::move(*error);
}

nb::list resize_many(nb::handle self_handle, nb::handle caches_arg_, nb::handle capacities_arg) {
  PyManager& self = nb::cast<PyManager&>(self_handle);
  const ManagerLock lock(self.manager->context());
  self.manager->require_live();
  const nb::tuple caches = items("caches", caches_arg_);
  const nb::tuple capacities = items("capacities", capacities_arg);
  same_length("capacities", capacities.size(), "caches", caches.size());
  std::vector<KVCache*> targets;
  std::vector<std::optional<std::int64_t>> values;
  targets.reserve(caches.size());
  values.reserve(caches.size());
  for (std::size_t i = 0; i < caches.size(); ++i) {
    targets.push_back(cache_arg(self_handle, caches[i], i));
    values.push_back(item("resize_many", "capacities", i,
                          [&] { return arg::optional_count("capacity", capacities[i], kTokenLimit); }));
  }
  std::vector<bool> results;
  std::optional<BatchFailure> failure;
  {
    nb::gil_scoped_release release;
    failure = kvcore::resize_many(targets, values, results);
  }
  nb::list out;
  for (bool r : results) out.append(r);
  if (failure) raise_failure(*failure, "resize_many", targets.size(), out);
  return out;
}

void commit_many(nb::handle self_handle, nb::handle caches_arg_, nb::handle tokens, nb::handle counts_arg,
                 nb::handle is_end) {
  PyManager& self = nb::cast<PyManager&>(self_handle);
  const ManagerLock lock(self.manager->context());
  self.manager->require_live();
  const nb::tuple caches = items("caches", caches_arg_);
  const nb::tuple counts_items = items("counts", counts_arg);
  same_length("counts", counts_items.size(), "caches", caches.size());
  std::vector<KVCache*> targets;
  std::vector<std::size_t> counts;
  targets.reserve(caches.size());
  counts.reserve(caches.size());
  for (std::size_t i = 0; i < caches.size(); ++i) {
    targets.push_back(cache_arg(self_handle, caches[i], i));
    counts.push_back(count_arg(counts_items[i], i));
  }
  // Viewed in place (a buffer) or packed once (a list, read as commit reads it); sliced per cache.
  const TokenInput input(tokens, self.manager->config().key_format);
  std::size_t total = 0;
  bool overflow = false;
  for (std::size_t c : counts) {
    overflow = overflow || total > SIZE_MAX - c;
    total += c;
  }
  if (overflow || total != input.tokens().count) {
    nb::object sum = nb::int_(0);  // exact, as Python's sum() prints it
    for (std::size_t c : counts) sum = nb::steal(PyNumber_Add(sum.ptr(), nb::int_(c).ptr()));
    fail(PyExc_ValueError, msg::kCountsSum, {str(sum), std::to_string(input.tokens().count)});
  }
  const bool end = arg::truthy(is_end);
  std::optional<BatchFailure> failure;
  {
    nb::gil_scoped_release release;
    failure = kvcore::commit_many(targets, input.tokens(), counts, end);
  }
  if (failure) {
    nb::list done;
    for (std::size_t i = 0; i < failure->index; ++i) done.append(nb::none());
    raise_failure(*failure, "commit_many", targets.size(), done);
  }
}

// Per iteration, per pool group: `values` (iterations * groups, in order) as lists of ints.
nb::list per_iteration(const std::vector<std::uint64_t>& values, std::size_t iterations) {
  nb::list out;
  const std::size_t groups = iterations == 0 ? 0 : values.size() / iterations;
  for (std::size_t k = 0; k < iterations; ++k) {
    nb::list row;
    for (std::size_t g = 0; g < groups; ++g) row.append(nb::steal(PyLong_FromUnsignedLongLong(values[k * groups + g])));
    out.append(row);
  }
  return out;
}

nb::object decode_steps(nb::handle self_handle, nb::handle caches_arg_, nb::handle tokens, nb::handle steps_arg,
                        nb::handle until_room_arg) {
  PyManager& self = nb::cast<PyManager&>(self_handle);
  const ManagerLock lock(self.manager->context());
  self.manager->require_live();
  const nb::tuple caches = items("caches", caches_arg_);
  std::vector<KVCache*> targets;
  targets.reserve(caches.size());
  for (std::size_t i = 0; i < caches.size(); ++i) targets.push_back(cache_arg(self_handle, caches[i], i));
  const auto steps = static_cast<std::size_t>(arg::int_between("steps", steps_arg, 0, kTokenLimit));
  // Viewed in place (a buffer) or packed once (a list); each iteration commits its slice.
  const TokenInput input(tokens, self.manager->config().key_format);
  const std::size_t n = targets.size(), count = input.tokens().count;
  if ((steps != 0 && n > SIZE_MAX / steps) || count != n * steps) {
    fail(PyExc_ValueError, msg::kDecodeTokens, {std::to_string(count), std::to_string(n), std::to_string(steps)});
  }
  std::optional<std::vector<std::uint64_t>> until_room;
  if (!until_room_arg.is_none()) {
    const nb::tuple room = items("until_room", until_room_arg);
    const std::size_t groups = self.manager->storage().statistics(0).size();
    same_length("until_room", room.size(), "pool groups", groups);
    until_room.emplace();
    for (std::size_t g = 0; g < groups; ++g) {
      const std::string where = "until_room[" + std::to_string(g) + "]";
      until_room->push_back(static_cast<std::uint64_t>(arg::int_between(where.c_str(), room[g], 0, kTokenLimit)));
    }
  }
  DecodeRun run;
  {
    nb::gil_scoped_release release;
    run = kvcore::decode_steps(*self.manager, targets, input.tokens(), steps, until_room ? &*until_room : nullptr);
  }
  if (run.failure) {
    nb::list done;
    for (std::size_t i = 0; i < run.failure->index; ++i) {
      done.append(run.failed_committing ? nb::object(nb::none()) : nb::object(nb::bool_(run.results[i])));
    }
    const std::string k = std::to_string(run.steps);
    raise_failure(*run.failure, run.failed_committing ? "commit_many" : "resize_many", n, done,
                  format(msg::kDecodeIteration, {k, std::to_string(steps), k}));
  }
  nb::list resized;
  for (bool r : run.resized) resized.append(r);
  return api("DecodeSteps")(run.steps, resized, per_iteration(run.free, run.steps),
                            per_iteration(run.evictable, run.steps));
}

nb::list admit_many(nb::handle self_handle, nb::handle scopes_arg, nb::handle prompts_arg, nb::handle ids_arg,
                    nb::handle callbacks_arg, nb::handle max_reused_arg) {
  PyManager& self = nb::cast<PyManager&>(self_handle);
  const ManagerLock lock(self.manager->context());
  self.manager->require_live();
  const nb::tuple scopes = items("reuse_scopes", scopes_arg);
  const nb::tuple prompts = items("prompts", prompts_arg);
  same_length("prompts", prompts.size(), "reuse_scopes", scopes.size());
  const std::size_t n = scopes.size();
  nb::tuple ids, callbacks, max_reused_items;
  if (!ids_arg.is_none()) {
    ids = items("ids", ids_arg);
    same_length("ids", ids.size(), "reuse_scopes", n);
  }
  if (!callbacks_arg.is_none()) {
    callbacks = items("priority_callbacks", callbacks_arg);
    same_length("priority_callbacks", callbacks.size(), "reuse_scopes", n);
  }
  if (!max_reused_arg.is_none()) {
    max_reused_items = items("max_reused_tokens", max_reused_arg);
    same_length("max_reused_tokens", max_reused_items.size(), "reuse_scopes", n);
  }
  // create_kv_cache's order for each prompt: the callback, the scope, the tokens, the id, max_reused_tokens.
  std::vector<std::unique_ptr<TokenInput>> inputs;
  std::vector<Admission> admissions;
  const KeyFormat format = self.manager->config().key_format;
  for (std::size_t i = 0; i < n; ++i) {
    nb::handle callback = callbacks_arg.is_none() ? nb::handle(Py_None) : nb::handle(callbacks[i]);
    item("admit_many", "priority_callbacks", i, [&] { arg::callable_or_none(callback); });
    const ReuseScope scope = item("admit_many", "reuse_scopes", i, [&] { return arg::reuse_scope(scopes[i]); });
    inputs.push_back(item("admit_many", "prompts", i, [&] {
      nb::handle p = prompts[i];
      return std::make_unique<TokenInput>(p.is_none() ? nb::tuple() : nb::borrow(p), format);
    }));
    const std::optional<std::int64_t> id = ids_arg.is_none() ? std::nullopt : item("admit_many", "ids", i, [&] {
      return arg::optional_count("id", ids[i], kCacheIdLimit);
    });
    const std::optional<std::int64_t> max_reused_tokens =
        max_reused_arg.is_none() ? std::nullopt : item("admit_many", "max_reused_tokens", i, [&] {
          return arg::optional_count("max_reused_tokens", max_reused_items[i], kTokenLimit);
        });
    admissions.push_back({scope, &inputs.back()->tokens(), id, priority_callback(callback, self), max_reused_tokens});
  }
  std::vector<std::unique_ptr<KVCache>> created;
  std::optional<BatchFailure> failure;
  {
    nb::gil_scoped_release release;
    failure = kvcore::admit_many(*self.manager, admissions, created);
  }
  nb::list out;
  for (std::size_t i = 0; i < created.size(); ++i) {
    nb::handle callback = callbacks_arg.is_none() ? nb::handle(Py_None) : nb::handle(callbacks[i]);
    auto* py_cache = new PyKVCache{nb::borrow(self_handle), nb::borrow(callback), std::move(created[i]), {}};
    out.append(nb::cast(py_cache, nb::rv_policy::take_ownership));
  }
  if (failure) raise_failure(*failure, "admit_many", n, out);
  return out;
}

}  // namespace

void register_batch(nb::module_& m) {
  nb::handle cls = m.attr("KVCacheManager");
  // Added to the class register_manager() made; every argument .none() (arguments.h checks None).
  nb::cpp_function_def(&resize_many, nb::scope(cls), nb::name("resize_many"), nb::is_method(), nb::arg("caches").none(),
                       nb::arg("capacities").none());
  nb::cpp_function_def(&commit_many, nb::scope(cls), nb::name("commit_many"), nb::is_method(), nb::arg("caches").none(),
                       nb::arg("tokens").none(), nb::arg("counts").none(), nb::arg("is_end").none() = false);
  nb::cpp_function_def(&decode_steps, nb::scope(cls), nb::name("decode_steps"), nb::is_method(),
                       nb::arg("caches").none(), nb::arg("tokens").none(), nb::arg("steps").none(),
                       nb::arg("until_room").none() = nb::none());
  nb::cpp_function_def(&admit_many, nb::scope(cls), nb::name("admit_many"), nb::is_method(),
                       nb::arg("reuse_scopes").none(), nb::arg("prompts").none(), nb::arg("ids").none() = nb::none(),
                       nb::arg("priority_callbacks").none() = nb::none(),
                       nb::arg("max_reused_tokens").none() = nb::none());
}

}  // namespace kvcore::py
