// What the native library was built with, for test headers and bug reports. Any thread (it
// selects the SHA-256 transform if none is yet: sha256.h).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace kvcore {

std::vector<std::pair<std::string, std::string>> build_info();

}  // namespace kvcore
