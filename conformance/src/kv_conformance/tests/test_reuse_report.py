"""Why a prompt missed (docs/manager.md, "Why a prompt missed"): ``KVCache.reuse_report`` splits
each prompt into reused tokens per level and the reasons the rest were not reused, the manager's
statistics sum them, and every backend gives the same report. Each scenario works its expected
report out by hand from the config (4 tokens a block unless said)."""

from __future__ import annotations

import random
from dataclasses import fields
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kv_api
from kv_api import GpuCacheTierConfig, HostCacheTierConfig, KVCacheManagerConfig, ReuseScope
from kv_api.stats import EvictedBlock, ReuseReport

from ._manager import GRAIN, attention, check_report, committed, make_config, toks, with_two_snapshots


def report(
    length: int,
    reused: tuple[int, ...] = (0,),
    *,
    stale: int = 0,
    capped: int = 0,
    evicted: int = 0,
    partial: int = 0,
    never_seen: int = 0,
    other_scope: int = 0,
    blocks: tuple[EvictedBlock, ...] = (),
) -> ReuseReport:
    return ReuseReport(length, reused, stale, capped, evicted, partial, never_seen, other_scope, blocks)


def reported(manager: kv_api.KVCacheManager, tokens: list[int], scope: ReuseScope | None = None, **kw: Any) -> Any:
    """The report of a cache created (and closed) on ``tokens``."""
    cache = manager.create_kv_cache(scope, tokens, **kw)
    out = cache.reuse_report
    check_report(cache, cache.tokens_per_block)
    cache.close()
    return out


def test_never_seen_then_reused(backend: kv_api.Backend) -> None:
    m = backend.KVCacheManager(make_config(4, slots=8))
    assert reported(m, toks(10)) == report(10, partial=2, never_seen=8)  # 2 blocks, a 2-token tail
    committed(m, toks(8))
    assert reported(m, toks(10)) == report(10, (8,), partial=2)
    assert reported(m, toks(3)) == report(3, (3,))  # partial reuse of block 0
    assert reported(m, []) == report(0)


def test_evicted_blocks_say_level_and_age(backend: kv_api.Backend) -> None:
    """Four device slots: committing another 4 blocks evicts the first prompt's (as the 3rd cache
    is made, so age 0 at the 4th); each later cache adds 1 to their age."""
    m = backend.KVCacheManager(make_config(4, slots=4))
    committed(m, toks(16))
    committed(m, toks(16, 100))
    gone = (EvictedBlock(0, 0),) * 4
    assert reported(m, toks(18)) == report(18, evicted=16, partial=2, blocks=gone)
    older = (EvictedBlock(0, 1),) * 2
    assert reported(m, [*toks(8), 7]) == report(9, evicted=8, partial=1, blocks=older)
    assert reported(m, toks(16, 100)) == report(16, (16,))


@pytest.mark.requires("host_tier")
def test_evicted_from_host(backend: kv_api.Backend) -> None:
    """8 device and 8 host slots: prompt A moves to the host when B comes, and is dropped from
    there when C comes; B then sits on the host."""
    config = make_config(4, slots=8)
    config = KVCacheManagerConfig(4, [GpuCacheTierConfig(GRAIN), HostCacheTierConfig(GRAIN)], config.layers)
    m = backend.KVCacheManager(config)
    for start in (0, 100, 200):
        committed(m, toks(32, start))
    assert reported(m, toks(32)) == report(32, (0, 0), evicted=32, blocks=(EvictedBlock(1, 0),) * 8)
    assert reported(m, toks(32, 100)) == report(32, (0, 32))
    assert reported(m, toks(32, 200)) == report(32, (32, 0))


def test_ghost_record_keeps_the_newest(backend: kv_api.Backend) -> None:
    """A ghost record of 2 keys: the first prompt's blocks leave last block first, so blocks 0 and
    1 are remembered, 2 and 3 forgotten (never seen, as far as the manager can tell)."""
    m = backend.KVCacheManager(make_config(4, slots=4, ghost_record_blocks=2))
    committed(m, toks(16))
    committed(m, toks(16, 100))
    assert reported(m, toks(16)) == report(16, evicted=8, never_seen=8, blocks=(EvictedBlock(0, 0),) * 2)
    # Block 0 evicted first (lowest priority) takes its subtree: descendants are recorded before
    # ancestors, so the two kept are still blocks 0 and 1.
    first = backend.KVCacheManager(make_config(4, slots=4, ghost_record_blocks=2))
    committed(first, toks(16), callback=lambda ordinal, life_cycle: 0 if ordinal == 0 else 50)
    committed(first, toks(4, 100))
    assert reported(first, toks(16)) == report(16, evicted=8, never_seen=8, blocks=(EvictedBlock(0, 0),) * 2)
    none = backend.KVCacheManager(make_config(4, slots=4, ghost_record_blocks=0))
    committed(none, toks(16))
    committed(none, toks(16, 100))
    assert reported(none, toks(16)) == report(16, never_seen=16)


@pytest.mark.parametrize("cuts", [(16,), (2, 16)], ids=["one commit", "a partial block first"])
def test_a_commit_keys_its_own_tokens_not_the_reported_prompts(backend: kv_api.Backend, cuts: tuple[int, ...]) -> None:
    """The report of a cache made on an evicted prompt hashed the prompt's blocks (the commit may
    take those keys rather than hash again); a cache that then commits other tokens keys them as
    its own. Block 2 differs by one token: what was committed is reused whole, the prompt only up
    to where the two part."""
    m = backend.KVCacheManager(make_config(4, slots=8, enable_partial_reuse=False))
    prompt = toks(16)
    for start in (0, 100, 200):  # the third evicts the first
        committed(m, toks(16, start))
    cache = m.create_kv_cache(None, prompt)
    assert cache.reuse_report is not None and cache.reuse_report.miss_evicted_tokens == 16
    assert cache.resume() and cache.resize(16)
    ours = [*prompt[:9], 999, *prompt[10:]]
    begin = 0
    for end in cuts:
        cache.commit(ours[begin:end])
        begin = end
    cache.close()
    assert reported(m, ours).reused_tokens_by_level == (16,)
    assert reported(m, prompt).reused_tokens_by_level == (8,)


def test_evicted_after_reused_prefix(backend: kv_api.Backend) -> None:
    """Blocks 0-1 committed again after all four were evicted: they are reused, 2-3 still evicted."""
    m = backend.KVCacheManager(make_config(4, slots=4))
    committed(m, toks(16))
    committed(m, toks(16, 100))
    committed(m, toks(8))
    assert reported(m, toks(16)) == report(16, (8,), evicted=8, blocks=(EvictedBlock(0, 1),) * 2)


def test_committed_again_leaves_the_ghost_record(backend: kv_api.Backend) -> None:
    """Evicted, committed again, then cleared (not an eviction): never seen, not evicted."""
    m = backend.KVCacheManager(make_config(4, slots=4))
    committed(m, toks(16))
    committed(m, toks(16, 100))
    committed(m, toks(16))
    m.clear_reusable_blocks()
    assert reported(m, toks(16)) == report(16, never_seen=16)
    # B was evicted by the second commit of A, and the clear does not forget that.
    assert reported(m, toks(16, 100)) == report(16, evicted=16, blocks=(EvictedBlock(0, 1),) * 4)


def test_capped_by_backoff_and_max_reused(backend: kv_api.Backend) -> None:
    m = backend.KVCacheManager(make_config(4, slots=16, reuse_match_backoff=3))
    committed(m, toks(12))
    assert reported(m, toks(14)) == report(14, (9,), capped=3, partial=2)
    plain = backend.KVCacheManager(make_config(4, slots=16))
    committed(plain, toks(12))
    assert reported(plain, toks(14), max_reused_tokens=5) == report(14, (5,), capped=7, partial=2)


@pytest.mark.requires("ssm_layers")
def test_stale_when_pruning_cuts_back(backend: kv_api.Backend) -> None:
    """Snapshots after tokens 8 and 10 (test_manager_reuse_match): a prompt diverging after token
    9 walks 9 tokens but reuses 8 (the state is valid at 8 only); one of 6 tokens reuses none."""
    m = with_two_snapshots(backend)
    assert reported(m, [*toks(9), 99]) == report(10, (8,), stale=1, partial=1)
    assert reported(m, toks(6)) == report(6, (0,), stale=6)


@pytest.mark.parametrize("partial", [False, True])
def test_tokens_below_a_block_boundary(backend: kv_api.Backend, partial: bool) -> None:
    """Block 1 of the prompt shares 2 tokens with a cached block 1: partial reuse takes them,
    without it they are lost below the boundary (partial)."""
    m = backend.KVCacheManager(make_config(4, slots=8, enable_partial_reuse=partial))
    committed(m, toks(8))
    prompt = [*toks(6), 99, 98, 97, 96]
    if partial:
        assert reported(m, prompt) == report(10, (6,), partial=2, never_seen=2)
    else:
        assert reported(m, prompt) == report(10, (4,), partial=4, never_seen=2)


def test_other_scope_is_opt_in(backend: kv_api.Backend) -> None:
    salted = ReuseScope(salt=1)
    prompt = [*toks(4), 50, 51, 52, 53, 54, 55]
    m = backend.KVCacheManager(make_config(4, slots=4, reuse_report_other_scope=True))
    committed(m, toks(8), scope=salted)
    assert reported(m, toks(10)) == report(10, other_scope=8, partial=2)
    assert reported(m, prompt) == report(10, other_scope=4, never_seen=4, partial=2)
    assert reported(m, toks(10), ReuseScope(lora_id=3)) == report(10, other_scope=8, partial=2)
    assert reported(m, toks(10), salted) == report(10, (8,), partial=2)
    committed(m, toks(16, 100))  # evicts the salted blocks: no scope holds them now
    assert reported(m, toks(10)) == report(10, partial=2, never_seen=8)
    off = backend.KVCacheManager(make_config(4, slots=4))
    committed(off, toks(8), scope=salted)
    assert reported(off, toks(10)) == report(10, partial=2, never_seen=8)


def test_statistics_sum_the_reports(backend: kv_api.Backend) -> None:
    """The manager's counters add each cache's report up (excluded ids feed nothing); with the
    report off, there is none and the counters stay 0."""
    m = backend.KVCacheManager(make_config(4, slots=4, reuse_match_backoff=1))
    committed(m, toks(16))
    committed(m, toks(16, 100))
    reports = [reported(m, p) for p in (toks(18), toks(16, 100), [*toks(5, 100), 1, 2, 3])]
    m.mark_stats_excluded(99)
    reported(m, toks(16), id=99)
    stats = m.get_committed_stats()
    for name in ("stale", "capped", "evicted", "partial", "never_seen", "other_scope"):
        assert getattr(stats, f"miss_{name}_tokens") == sum(getattr(r, f"miss_{name}_tokens") for r in reports)
    assert stats.miss_evicted_tokens == 16 and stats.miss_capped_tokens == 2
    assert stats.reused_tokens + sum(getattr(stats, f.name) for f in fields(stats) if f.name.startswith("miss_")) == (
        stats.lookup_tokens
    )
    off = backend.KVCacheManager(make_config(4, slots=4, reuse_report=False))
    assert reported(off, toks(10)) is None
    assert all(getattr(off.get_committed_stats(), f.name) == 0 for f in fields(stats) if f.name.startswith("miss_"))


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("reuse_report", 1, TypeError),
        ("reuse_report_other_scope", "yes", TypeError),
        ("ghost_record_blocks", -1, ValueError),
        ("ghost_record_blocks", 1 << 31, ValueError),
        ("ghost_record_blocks", 2.0, TypeError),
    ],
)
def test_bad_report_config(field: str, value: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match=field):
        make_config(4, **{field: value})


@given(
    prompts=st.lists(st.lists(st.integers(0, 2), max_size=14), min_size=1, max_size=12),
    slots=st.integers(2, 8),
    partial=st.booleans(),
    backoff=st.sampled_from([0, 0, 1, 3]),
    ghost=st.sampled_from([0, 1, 3, 65536]),
    other=st.booleans(),
    salts=st.lists(st.sampled_from([None, 1, 2]), min_size=1, max_size=4),
)
@settings(max_examples=60, deadline=None)
def test_reports_add_up_and_agree(
    backends: list[kv_api.Backend],
    prompts: list[list[int]],
    slots: int,
    partial: bool,
    backoff: int,
    ghost: int,
    other: bool,
    salts: list[int | None],
) -> None:
    """Random prompts over 3 token values (so they share prefixes) under pressure, each committed
    whole after its report: every report adds up to its prompt, and the backends agree on each."""
    seen = []
    for b in backends:
        config = make_config(
            2,
            slots=slots,
            layers=[attention(0, GRAIN // slots)],
            enable_partial_reuse=partial,
            reuse_match_backoff=backoff,
            ghost_record_blocks=ghost,
            reuse_report_other_scope=other,
        )
        scopes = [None if salt is None else ReuseScope(salt=salt) for salt in salts]
        seen.append(committed_in_turn(b.KVCacheManager(config), prompts, scopes, checked=True))
    assert all(s == seen[0] for s in seen)


def committed_in_turn(
    m: kv_api.KVCacheManager, prompts: list[list[int]], scopes: list[ReuseScope | None], checked: bool = False
) -> list[object]:
    """Each prompt's report (checked to add up where ``checked``), the prompt committed whole
    where it fits, in turn (prompt i under scopes[i % len(scopes)]); then the manager's stats."""
    got: list[object] = []
    for i, prompt in enumerate(prompts):
        cache = m.create_kv_cache(scopes[i % len(scopes)], prompt)
        if checked:
            check_report(cache, cache.tokens_per_block)
        got.append(cache.reuse_report)
        if cache.resume() and cache.resize(len(prompt)):
            cache.commit(prompt[cache.num_committed_tokens :])
        cache.close()
    got.append(m.get_committed_stats())
    return got


@pytest.mark.parametrize(("ghost", "values", "distinct"), [(64, 4, None), (8192, 64, 600)])
def test_a_long_run_agrees(backends: list[kv_api.Backend], ghost: int, values: int, distinct: int | None) -> None:
    """Thousands of evictions into a ghost record, blocks committed again and evicted again: what
    the record keeps gives the same reports on every backend. A small record is full; a large
    one (prompts drawn again from ``distinct`` ones, so that blocks come back) grows its native
    index many times and compacts its log (every thousand or so entries left behind) with
    thousands of entries live."""
    rng = random.Random(11)
    pool = [[rng.randrange(values) for _ in range(rng.randrange(2, 15))] for _ in range(distinct or 2500)]
    prompts = pool if distinct is None else [rng.choice(pool) for _ in range(2500)]
    seen = []
    for b in backends:
        seen.append(
            committed_in_turn(b.KVCacheManager(make_config(2, slots=8, ghost_record_blocks=ghost)), prompts, [None])
        )
    reports = [r for r in seen[0] if isinstance(r, ReuseReport)]
    assert sum(len(r.evicted_blocks) for r in reports) > 1000  # the record was used
    assert all(s == seen[0] for s in seen)
