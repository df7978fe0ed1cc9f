"""Host and disk tiers (docs/manager.md, "Eviction and tiers"): levels and their files
(``test_levels``), cascade eviction and held pages (``test_eviction``), reuse from colder levels
(``test_reuse``), ``prefetch`` (``test_prefetch``), quota resize (``test_resize``), page data
across levels (``test_integrity``), copies and copier faults (``test_faults``), disk faults
(``test_disk_faults``, and searched for: ``test_disk_differential``). ``_helpers`` has the
standard config and the event model; ``conftest`` the file systems of their own."""
