// What the native library was built with, for test headers and bug reports.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace kvcore {

std::vector<std::pair<std::string, std::string>> build_info();

}  // namespace kvcore
