"""The chain-aware LRU keeps what a server at maxmemory stores reachable (chain_reachability.py
measures it at full size and against the naive order)."""

from __future__ import annotations

import pytest

pytest.importorskip("redis")

from chain_reachability import Workload, run


def test_stored_bytes_stay_reachable() -> None:
    # ~6 s: 2x maxmemory written, the server holding ~2.5 s of writes
    workload = Workload(maxmemory=12 << 20, history_s=2.5, passes=2.0, seed=3)
    result = run(workload, order_chains=True)
    assert result.stored_blocks > 400  # the server is full, and of blocks
    assert result.store_evicted > 0
    assert result.reachable >= 0.9, result
