// Reading a kv_api.KVCacheManagerConfig into the core's KVCacheManagerConfig (manager_config.cc).
#pragma once

#include <nanobind/nanobind.h>

#include "kvcore/config.h"

namespace kvcore::py {

// `config` is a kv_api.KVCacheManagerConfig (arg::manager_config checked it): its fields are read
// as they are, kv_api having validated them.
KVCacheManagerConfig manager_config(nanobind::handle config);

}  // namespace kvcore::py
