// One register_* function per concept, each defined in its register_<concept>.cc; module.cc calls
// them in order.
#pragma once

#include <nanobind/nanobind.h>

namespace kvcore::py {

void register_errors(nanobind::module_& m);
void register_keys(nanobind::module_& m);
void register_manager(nanobind::module_& m);
void register_manager_reuse(nanobind::module_& m);  // after register_manager: adds KVCacheManager methods
void register_event_manager(nanobind::module_& m);
void register_kv_cache(nanobind::module_& m);
void register_planned_drop(nanobind::module_& m);
void register_batch(nanobind::module_& m);  // after register_manager: adds KVCacheManager methods

}  // namespace kvcore::py
