// One exception type for the core; its kind says which Python class the binding raises,
// so both backends raise the same classes (kv_api.errors or Python builtins). A call that throws
// leaves the manager as it was unless the member says otherwise (docs/errors.md); kCorrupted is
// only made by the poison latch, so it has poisoned the core (poison.h).
#pragma once

#include <optional>
#include <stdexcept>
#include <string>

namespace kvcore {

enum class ErrorKind {
  kValue,           // ValueError
  kType,            // TypeError
  kIndex,           // IndexError
  kKey,             // KeyError
  kLogic,           // kv_api.errors.LogicError
  kInvalidState,    // kv_api.errors.InvalidStateError
  kOutOfPages,      // kv_api.errors.OutOfPagesError
  kHostOOM,         // kv_api.errors.HostOOMError
  kDiskOOM,         // kv_api.errors.DiskOOMError
  kOS,              // OSError(errno, message): a failing system call (disk I/O)
  kCorrupted,       // kv_api.errors.CorruptedError
  kNotImplemented,  // NotImplementedError
  kRuntime,         // RuntimeError (a debug hook used without KV_DEBUG_HOOKS=1)
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message, int error_number = 0)
      : std::runtime_error(message), kind_(kind), errno_(error_number) {}
  ErrorKind kind() const noexcept { return kind_; }
  int error_number() const noexcept { return errno_; }  // kOS (and kDiskOOM): the errno
  // The cache level whose memory or files failed (at_level, cache_level.h); the binding gives it
  // to the Python exception as `level` (docs/errors.md, "Which level").
  std::optional<int> level() const noexcept { return level_; }
  void set_level(int level) noexcept { level_ = level; }

 private:
  ErrorKind kind_;
  int errno_;
  std::optional<int> level_;
};

}  // namespace kvcore
