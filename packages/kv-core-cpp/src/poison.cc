#include "kvcore/poison.h"

#include <atomic>
#include <cstdlib>
#include <mutex>

namespace kvcore::poison {

namespace {

std::mutex mutex;
std::optional<std::string> recorded;  // guarded by `mutex`
// Mirrors `recorded` for check(), which every public call makes: one load, no lock, when clear.
std::atomic<bool> poisoned{false};
std::int64_t live_managers = 0;  // guarded by `mutex`

}  // namespace

void record(const std::string& reason) {
  const std::lock_guard<std::mutex> guard(mutex);
  if (recorded) return;
  recorded = reason;
  poisoned.store(true, std::memory_order_release);
}

Error corrupted(const std::string& reason) {
  record(reason);
  return Error(ErrorKind::kCorrupted, reason);
}

void check() {
  if (!poisoned.load(std::memory_order_acquire)) return;
  const std::optional<std::string> r = reason();
  if (r) throw Error(ErrorKind::kCorrupted, "kvcore is poisoned: " + *r);
}

std::optional<std::string> reason() {
  const std::lock_guard<std::mutex> guard(mutex);
  return recorded;
}

std::optional<std::string> take() {
  const std::lock_guard<std::mutex> guard(mutex);
  if (recorded && live_managers) {
    throw Error(ErrorKind::kLogic, "take_poison(): " + std::to_string(live_managers) + " manager(s) still alive");
  }
  std::optional<std::string> taken;
  taken.swap(recorded);
  poisoned.store(false, std::memory_order_release);
  return taken;
}

std::int64_t num_live_managers() {
  const std::lock_guard<std::mutex> guard(mutex);
  return live_managers;
}

void debug_poison(const std::string& reason) {
  const char* value = std::getenv(kDebugHooksEnv);
  if (value == nullptr || std::string(value) != "1") {
    throw Error(ErrorKind::kRuntime,
                std::string("_debug_poison: a debug hook, refused unless ") + kDebugHooksEnv + "=1");
  }
  record(reason);
}

LiveManager::LiveManager() {
  check();
  const std::lock_guard<std::mutex> guard(mutex);
  ++live_managers;
}

void LiveManager::release() {
  if (!live_) return;
  live_ = false;
  const std::lock_guard<std::mutex> guard(mutex);
  --live_managers;
}

}  // namespace kvcore::poison
