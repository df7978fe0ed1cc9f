"""More life cycles than a cache's per-block record keeps inline (the native backend stores up
to 4 per block without allocating): six attention layers, each its own life cycle (full
attention, sinks and four windows). Commit, reuse, the window's stale pages and the indices of
every layer group agree with the spec's stale ranges and between the backends."""

from __future__ import annotations

from typing import Any

import kv_api

from ._manager import (
    active,
    attention,
    check_accounting,
    check_indices,
    committed,
    life_cycles,
    make_config,
    stale_range,
    toks,
)

TPB = 4
LAYERS = [
    attention(0, 64),
    attention(1, 64, 8, 1),
    attention(2, 64, 8),
    attention(3, 64, 12),
    attention(4, 64, 16),
    attention(5, 64, 20),
]


def scenario(backend: kv_api.Backend) -> list[Any]:
    manager = backend.KVCacheManager(make_config(TPB, layers=LAYERS, quota=64 * 6 * 64))
    assert len(life_cycles(manager)) == 6
    prompt = toks(40, 7)
    committed(manager, prompt)
    seen: list[Any] = []
    cache = active(manager, 48, reuse=prompt)
    check_indices(manager, cache)
    seen.append(cache.num_committed_tokens)
    for lg, life in enumerate(life_cycles(manager)):
        indices = list(cache.get_base_page_indices(lg))
        stale = stale_range(life, cache.history_length, TPB)
        # A page for every block outside the stale range, none inside it.
        assert [i for i, s in enumerate(indices) if s < 0] == list(stale), lg
        seen.append(indices)
    cache.commit(toks(8, 100))
    seen.append(manager.probe_reuse(None, prompt + toks(8, 100)))
    cache.close()
    check_accounting(manager, open_caches=False)
    return seen


def test_six_life_cycles(backend: kv_api.Backend) -> None:
    seen = scenario(backend)
    assert seen[0] == 40
    assert seen[-1] == 48


def test_six_life_cycles_backends_agree(backends: list[kv_api.Backend]) -> None:
    results = [scenario(b) for b in backends]
    assert all(r == results[0] for r in results[1:])
