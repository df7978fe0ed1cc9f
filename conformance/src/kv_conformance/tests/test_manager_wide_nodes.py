"""A radix-tree node with many children (docs/manager.md "Reuse"): lookups, evictions and
partial-match ties stay right while a node's children grow past and shrink below the point
where the native backend switches from scanning them to a hash index (8 children), and both
backends agree on what is reused and on the slots a reusing cache gets."""

from __future__ import annotations

from typing import Any

import kv_api

from ._manager import active, check_accounting, committed, make_config, priority

TPB = 4
SLOTS = 32
PREFIX = [1000, 1001, 1002, 1003]  # block 0, shared by every child


def child(i: int) -> list[int]:
    """Child ``i``'s block: its first two tokens are shared by pairs (2k, 2k + 1), for ties."""
    return [i // 2, 500, 10 * i + 1, 10 * i + 2]


def reused(manager: kv_api.KVCacheManager, n: int) -> list[int]:
    return [manager.probe_reuse(None, PREFIX + child(i)) for i in range(n)]


def scenario(backend: kv_api.Backend) -> list[Any]:
    """What the manager reuses at each step, and the slots of caches reusing two children."""
    manager = backend.KVCacheManager(make_config(TPB, slots=SLOTS, enable_partial_reuse=True))
    seen: list[Any] = []
    for i in range(20):  # 20 children under the prefix block, released in order: 21 pages
        committed(manager, PREFIX + child(i))
    seen.append(reused(manager, 20))
    # A partial match scans all 20 children (fewer than the scan limit of 32): [3, 500] of
    # child 6 (or 7); nothing starts [3, 501].
    match = manager.probe_reuse_match(None, [*PREFIX, 3, 500, 999])
    seen.append((match.num_reused_tokens, manager.probe_reuse(None, [*PREFIX, 3, 501])))
    # 25 fresh pages evict the 14 children released first (the prefix, held by every cache,
    # was released last): 6 children are left.
    big = active(manager, 25 * TPB, callback=priority(0))
    seen.append(reused(manager, 20))
    big.close()  # uncommitted: its pages are freed
    for i in range(20, 30):  # 16 children again
        committed(manager, PREFIX + child(i))
    seen.append(reused(manager, 30))
    for i in (15, 29):
        cache = active(manager, None, reuse=PREFIX + child(i))
        seen.append((cache.num_committed_tokens, list(cache.get_base_page_indices(0))))
        cache.close()
    check_accounting(manager, open_caches=False)
    manager.clear_reusable_blocks()
    seen.append(reused(manager, 30))
    return seen


def test_many_children_are_found_evicted_and_matched(backend: kv_api.Backend) -> None:
    seen = scenario(backend)
    assert seen[0] == [8] * 20
    assert seen[1] == (6, 5)
    assert seen[2] == [4] * 14 + [8] * 6
    assert seen[3] == [4] * 14 + [8] * 16
    assert [n for n, _ in seen[4:6]] == [8, 8]
    assert seen[6] == [0] * 30


def test_many_children_backends_agree(backends: list[kv_api.Backend]) -> None:
    results = [scenario(b) for b in backends]
    assert all(r == results[0] for r in results[1:])
