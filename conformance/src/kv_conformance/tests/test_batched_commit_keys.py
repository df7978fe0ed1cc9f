"""``commit_many`` puts every block it fills into the radix tree under its own key, whether the
backend hashes each cache's blocks during its commit or several caches' blocks ahead of the
batch (``kv_core_cpp`` pairs the chains: docs/manager.md, "Batched calls"). Checked against the
reference keys (``kv_api.keys``), the events and the single calls, with partial blocks already
committed, a cache listed twice, digest tokens, a cache that stopped committing and a failing
call in the middle."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

import kv_api
from kv_api.events import KVCacheEvent, Stored

from ._manager import make_config
from .test_manager_events import drain, setup

pytestmark = pytest.mark.requires("batched_calls")

TPB = 4
DIGEST = bytes(range(32))


def stored_hashes(events: list[KVCacheEvent]) -> list[Any]:
    return [b.block_hash for e in events if isinstance(e.data, Stored) for b in e.data.blocks]


def reference_hashes(tokens: list[Any], partial: bool = False) -> list[str]:
    """The ``v2_sha256`` hashes of the full blocks of ``tokens`` (and of the partial tail with
    ``partial``), from kv_api.keys, the reference."""
    raw = kv_api.keys.block_keys(TPB, None, tokens)
    end = len(raw) if partial else 32 * (1 + len(tokens) // TPB)
    return [raw[i : i + 32].hex() for i in range(32, end, 32)]


def world(backend: kv_api.Backend, prompts: list[list[Any]]) -> tuple[Any, Any, list[kv_api.KVCache]]:
    manager, events = setup(backend, make_config(TPB, slots=1024))
    caches = []
    for p in prompts:
        c = manager.create_kv_cache(None, [])
        assert c.resume() and c.resize(120)
        if p:
            c.commit(p)
        caches.append(c)
    drain(events)
    return manager, events, caches


@pytest.mark.parametrize("seed", range(4))
def test_blocks_filled_by_a_batch_enter_the_tree_under_their_keys(backend: kv_api.Backend, seed: int) -> None:
    rng = random.Random(seed)
    # Caches 0-2 start inside a block; cache 3 holds a digest token; cache 4 is listed twice;
    # cache 5 has stopped committing (its blocks never enter the tree).
    starts: list[list[Any]] = [[rng.randrange(1000) for _ in range(n)] for n in (1, 6, 3, 2, 0, 5)]
    starts[3][1] = DIGEST
    (batched, b_events, bc), (single, s_events, sc) = (world(backend, starts), world(backend, starts))
    for c in (bc[5], sc[5]):
        c.stop_committing()
    order = [0, 1, 2, 3, 4, 4, 0]
    counts = [rng.randrange(4, 30) for _ in order]
    flat: list[Any] = [rng.randrange(1000) for _ in range(sum(counts))]
    flat[counts[0] + 2] = DIGEST  # inside cache 1's tokens
    with pytest.raises(kv_api.errors.LogicError):
        batched.commit_many([bc[i] for i in order] + [bc[5]], [*flat, 7], [*counts, 1])
    begin = 0
    for i, n in zip(order, counts, strict=True):
        sc[i].commit(flat[begin : begin + n])
        begin += n
    with pytest.raises(kv_api.errors.LogicError):
        sc[5].commit([7])
    got, want = stored_hashes(drain(b_events)), stored_hashes(drain(s_events))
    assert got == want and len(got) >= 10
    reference: set[str] = set()
    for b, s in zip(bc, sc, strict=True):
        assert b.committed_tokens == s.committed_tokens
        tokens = list(b.committed_tokens)
        reference |= set(reference_hashes(tokens, partial=b is bc[5]))  # its tail on stop_committing
        if b is not bc[5]:
            # Every full block is in the tree under its key: a lookup finds them all again.
            assert batched.probe_reuse(None, [*tokens, 1]) == single.probe_reuse(None, [*tokens, 1])
            assert batched.probe_reuse(None, [*tokens, 1]) == len(tokens) // TPB * TPB
    assert set(got) <= reference
    assert bc[5].committed_tokens == starts[5]


def test_two_prefills_in_one_batch(backend: kv_api.Backend) -> None:
    """Two caches filling hundreds of blocks each from int32 buffers (the paired chains run in
    lock step), and a third filling none."""
    rng = np.random.default_rng(3)
    lengths = (1203, 987, 3)
    parts = [rng.integers(0, 2**31, n, dtype=np.int32) for n in lengths]
    manager, events = setup(backend, make_config(TPB, slots=1024), entries=4000)
    caches = [manager.create_kv_cache(None, []) for _ in lengths]
    assert all(c.resume() and c.resize(n) for c, n in zip(caches, lengths, strict=True))
    drain(events)
    manager.commit_many(caches, np.concatenate(parts), list(lengths))
    got = stored_hashes(drain(events))
    want = [h for p in parts for h in reference_hashes(p.tolist())]
    assert got == want and len(want) == 1203 // TPB + 987 // TPB
