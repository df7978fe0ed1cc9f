#include "kvcore/build_info.h"

#include "kvcore/sha256.h"

namespace kvcore {

std::vector<std::pair<std::string, std::string>> build_info() {
  std::string available;
  for (const std::string& name : sha256::available()) available += (available.empty() ? "" : ",") + name;
  return {
      {"compiler", KVCORE_COMPILER},     {"build_type", KVCORE_BUILD_TYPE}, {"cxx_flags", KVCORE_CXX_FLAGS},
      {"sha256", sha256::active().name}, {"sha256_available", available},
  };
}

}  // namespace kvcore
