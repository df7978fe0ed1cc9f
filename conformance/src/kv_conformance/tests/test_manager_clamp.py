"""Sizing a batch (issue 12, item 5; docs/manager.md, "Sizing a batch: clamp_max_seq_len_for_mem"):
``clamp_max_seq_len_for_mem`` is the longest block-aligned length one request may reach while the
others hold a token each, by the documented rule, on full attention, windows (their peak, not
their end) and SSM layers, after a quota resize too; run, that length is reached and one block
more is not; bad arguments and a shut-down manager are refused alike on every backend.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kv_api
from kv_api import KVCacheManagerConfig
from kv_api.constants import TOKEN_LIMIT, ceil_div
from kv_api.errors import InvalidStateError

from ._manager import GRAIN, attention, make_config, raises_exactly, snapshot, ssm_hybrid


def one_group(tpb: int, slots: int, window: int | None, sinks: int | None = None) -> KVCacheManagerConfig:
    """Full attention plus (``window``) a window layer, one pool group of ``slots`` slots."""
    layers = [attention(0, GRAIN // slots)]
    if window is not None:
        layers.append(attention(1, GRAIN // slots, window, sinks))
    return make_config(tpb, layers=layers)


def model_clamp(manager: kv_api.KVCacheManager, batch_size: int, bound: int) -> int:
    """The documented rule, step by step: the long request's need is the most it holds at any
    decode step (history h, capacity h + 1, h < L); each other request holds one slot per life
    cycle; every pool group must fit."""
    tpb = manager.tokens_per_block
    lcs = manager.life_cycles

    def need(lc: kv_api.LifeCycle, length: int) -> int:
        if lc.ssm:
            return 1
        most = 0
        for h in range(length):
            blocks = ceil_div(h + 1, tpb)
            begin, end = lc.get_stale_range(h)
            most = max(most, blocks - max(0, min(end, blocks) - min(begin, blocks)))
        return most

    best = 0
    for length in range(tpb, bound + 1, tpb):
        if all(
            sum(batch_size - 1 + need(lcs[lc], length) for lc in pg.life_cycles) <= pg.num_slots
            for pg in manager.pool_group_descs
        ):
            best = length
    return best


@pytest.mark.parametrize(
    ("batch_size", "bound", "expected"),
    [
        (1, 10**6, 8180),  # 2048 slots: L/4 full-attention blocks + the window's 3
        (100, 10**6, 7388),  # 99 one-token requests hold 2 slots each
        (1, 10, 8),  # block-aligned, at most the bound
        (1, 3, 0),  # no whole block below the bound
        (1, 0, 0),
        (1022, 10**6, 12),  # 2042 + 3 full + 3 window
        (1023, 10**6, 8),  # 2044 + 2 full + 2 window
        (1024, 10**6, 4),  # 2046 + 1 + 1
        (1025, 10**6, 0),  # the one-token requests alone fill the pool
    ],
)
def test_clamp_values(backend: kv_api.Backend, batch_size: int, bound: int, expected: int) -> None:
    m = backend.KVCacheManager(one_group(4, 2048, 8))
    assert m.pool_group_descs[0].num_slots == 2048
    assert m.clamp_max_seq_len_for_mem(batch_size, bound) == expected


def test_clamp_counts_the_window_peak_not_the_end(backend: kv_api.Backend) -> None:
    """tpb 32, window 64: a request of 128 tokens holds 2 window blocks at its last step but 3 at
    history 96 (capacity 97); the window's need is the peak, so with 3 + 4 slots a 128-token
    request fits and with 3 + 4 - 1 it does not (the full attention layer holding 4)."""
    for slots, expected in ((7, 128), (6, 96)):
        m = backend.KVCacheManager(one_group(32, slots, 64))
        assert m.clamp_max_seq_len_for_mem(1, 10**6 if slots == 6 else 128) == expected


@pytest.mark.requires("ssm_layers")
def test_clamp_ssm_needs_a_slot_per_request(backend: kv_api.Backend) -> None:
    m = backend.KVCacheManager(ssm_hybrid())
    ssm_slots = next(pg.num_slots for pg in m.pool_group_descs if 2 in pg.life_cycles)
    attn_slots = next(pg.num_slots for pg in m.pool_group_descs if 0 in pg.life_cycles)
    assert m.clamp_max_seq_len_for_mem(ssm_slots, 10**9) > 0
    assert m.clamp_max_seq_len_for_mem(ssm_slots + 1, 10**9) == 0
    # Attention: (n - 1) * 2 + L/4 + window peak 3 <= attention slots.
    assert m.clamp_max_seq_len_for_mem(1, 10**9) == (attn_slots - 3) * 4
    assert m.clamp_max_seq_len_for_mem(2, 10**9) == (attn_slots - 5) * 4


def test_clamp_follows_a_quota_resize(backend: kv_api.Backend) -> None:
    m = backend.KVCacheManager(make_config(4, slots=64))
    assert m.clamp_max_seq_len_for_mem(1, 10**6) == 64 * 4
    assert m.resize(0, 2 * GRAIN)
    assert m.clamp_max_seq_len_for_mem(1, 10**6) == 128 * 4
    assert m.clamp_max_seq_len_for_mem(2, 10**6) == 127 * 4


@pytest.mark.parametrize("window", [5, 8, 13])
def test_clamped_length_is_reachable_and_the_next_is_not(backend: kv_api.Backend, window: int) -> None:
    """Run it: batch_size - 1 one-token requests resumed, then one request decoding token by token
    (committing as it goes, so stale window pages become evictable) reaches the clamped length;
    one block more runs out of pages on the way."""
    tpb, slots, batch = 4, 16, 3
    for extra, ok in ((0, True), (tpb, False)):
        m = backend.KVCacheManager(one_group(tpb, slots, window))
        length = m.clamp_max_seq_len_for_mem(batch, 10**6)
        assert length == model_clamp(m, batch, 200)
        small = []
        for i in range(batch - 1):
            c = m.create_kv_cache(None, None, 1000 + i)
            assert c.resume() and c.resize(1)
            small.append(c)
        long = m.create_kv_cache()
        assert long.resume()
        reached = True
        for h in range(length + extra):
            if not long.resize(h + 1):
                reached = False
                break
            long.commit([h])
        assert reached is ok
        for c in [*small, long]:
            c.close()


@given(
    tpb=st.sampled_from([1, 2, 4, 8]),
    window=st.one_of(st.none(), st.integers(1, 40)),
    sinks=st.one_of(st.none(), st.integers(1, 9)),
    slots=st.integers(2, 64),
    batch=st.integers(1, 40),
    bound=st.integers(0, 120),
)
@settings(max_examples=60, deadline=None)
def test_clamp_property(
    backends: list[kv_api.Backend],
    tpb: int,
    window: int | None,
    sinks: int | None,
    slots: int,
    batch: int,
    bound: int,
) -> None:
    config = one_group(tpb, slots, window, sinks if window is not None else None)
    got = []
    for b in backends:
        m = b.KVCacheManager(config)
        got.append(m.clamp_max_seq_len_for_mem(batch, bound))
        assert got[-1] == model_clamp(m, batch, bound)
    assert len(set(got)) == 1


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        ((0, 10), ValueError, f"batch_size: must be in [1, {TOKEN_LIMIT}) (got 0)"),
        ((-1, 10), ValueError, f"batch_size: must be in [1, {TOKEN_LIMIT}) (got -1)"),
        ((TOKEN_LIMIT, 10), ValueError, f"batch_size: must be in [1, {TOKEN_LIMIT}) (got {TOKEN_LIMIT})"),
        ((1, -1), ValueError, f"token_upper_bound: must be in [0, {TOKEN_LIMIT}) (got -1)"),
        ((1, TOKEN_LIMIT), ValueError, f"token_upper_bound: must be in [0, {TOKEN_LIMIT}) (got {TOKEN_LIMIT})"),
        (("1", 10), TypeError, "batch_size: expected an int, got str"),
        ((True, 10), TypeError, "batch_size: expected an int, got bool"),
        ((None, 10), TypeError, "batch_size: expected an int, got NoneType"),
        ((1, 2.0), TypeError, "token_upper_bound: expected an int, got float"),
        ((0, "x"), ValueError, f"batch_size: must be in [1, {TOKEN_LIMIT}) (got 0)"),  # left to right
    ],
)
def test_clamp_bad_arguments(
    backends: list[kv_api.Backend], args: tuple[Any, Any], error: type[Exception], message: str
) -> None:
    for b in backends:
        m = b.KVCacheManager(make_config())
        before = snapshot(m)
        e = raises_exactly(error, partial(m.clamp_max_seq_len_for_mem, *args))
        assert str(e) == message
        assert snapshot(m) == before


def test_clamp_after_shutdown(backend: kv_api.Backend) -> None:
    m = backend.KVCacheManager(make_config())
    m.shutdown()
    raises_exactly(InvalidStateError, lambda: m.clamp_max_seq_len_for_mem(1, 8))
