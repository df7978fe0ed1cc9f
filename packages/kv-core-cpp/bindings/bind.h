// One bind_* function per concept; module.cc calls them in order.
#pragma once

#include <nanobind/nanobind.h>

namespace kvcore::py {

void bind_errors(nanobind::module_& m);
void bind_keys(nanobind::module_& m);
void bind_manager(nanobind::module_& m);
void bind_event_manager(nanobind::module_& m);
void bind_kv_cache(nanobind::module_& m);
void bind_planned_drop(nanobind::module_& m);
void bind_batch(nanobind::module_& m);  // after bind_manager: adds KVCacheManager methods

}  // namespace kvcore::py
