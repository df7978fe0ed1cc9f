// One exception type for the core; its kind says which Python class the binding raises,
// so both backends raise the same classes (kv_api.errors or Python builtins).
#pragma once

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
  kCorrupted,       // kv_api.errors.CorruptedError
  kNotImplemented,  // NotImplementedError
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const noexcept { return kind_; }

 private:
  ErrorKind kind_;
};

}  // namespace kvcore
