"""A per-request reuse cap: ``max_reused_tokens`` in ``create_kv_cache``, ``admit_many`` and the
probes (docs/manager.md, "Reuse"). An engine caps reuse at ``len(prompt) - 1`` so that a fully
matched prompt still leaves one token whose forward gives the first output token's logits."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kv_api
from kv_api import AttentionLayerConfig, BufferConfig, GpuCacheTierConfig, KVCacheManagerConfig, SsmLayerConfig

from ._manager import MIB, committed, make_config, make_manager, snapshot, toks

TPB = 4
PROMPT = toks(21, 100)


def reuses(m: kv_api.KVCacheManager, tokens: list[int], cap: int | None) -> int:
    """What every call that takes the cap reuses, checked equal: the probes, create_kv_cache,
    admit_many."""
    probe = m.probe_reuse(None, tokens, cap)
    match = m.probe_reuse_match(None, tokens, max_reused_tokens=cap)
    cache = m.create_kv_cache(None, tokens, max_reused_tokens=cap)
    [admitted] = m.admit_many([None], [tokens], max_reused_tokens=[cap])
    got = {probe, match.num_reused_tokens, cache.num_committed_tokens, admitted.num_committed_tokens}
    assert len(got) == 1, (cap, probe, match, cache.num_committed_tokens, admitted.num_committed_tokens)
    assert cache.expected_prompt_length == len(tokens)  # the cap does not shorten the prompt
    assert match.num_divergence_tokens == m.probe_reuse_match(None, tokens).num_divergence_tokens
    cache.close()
    admitted.close()
    return probe


@pytest.mark.parametrize("backoff", [0, 3, 6])
def test_cap_after_backoff_on_full_attention(backend: kv_api.Backend, backoff: int) -> None:
    """Full attention reuses exactly ``min(walked - reuse_match_backoff, cap)`` tokens: the cap
    cuts the match's tail like the backoff does, partial block included."""
    m = make_manager(backend, make_config(TPB, slots=32, reuse_match_backoff=backoff))
    committed(m, PROMPT)
    full = len(PROMPT) - backoff
    assert reuses(m, PROMPT, None) == full
    for cap in range(len(PROMPT) + 3):
        assert reuses(m, PROMPT, cap) == min(full, cap), cap
    assert reuses(m, PROMPT, 10**6) == full


def test_engine_leaves_the_last_prompt_token(backend: kv_api.Backend) -> None:
    """A prompt held whole reuses all but one token under ``len(prompt) - 1``; the cache then
    computes that token and commits it, and the prompt is reusable whole again."""
    m = make_manager(backend, make_config(TPB, slots=32))
    committed(m, PROMPT)
    cache = m.create_kv_cache(None, PROMPT, max_reused_tokens=len(PROMPT) - 1)
    assert cache.num_committed_tokens == len(PROMPT) - 1
    assert cache.resume() and cache.resize(len(PROMPT))
    cache.commit(PROMPT[-1:])
    cache.close()
    assert m.probe_reuse(None, PROMPT) == len(PROMPT)


@settings(max_examples=30, deadline=None)
@given(cap=st.integers(0, 40), prefix=st.integers(0, 21))
def test_cap_is_monotone_and_never_exceeded(backend: kv_api.Backend, cap: int, prefix: int) -> None:
    m = make_manager(backend, make_config(TPB, slots=32))
    committed(m, PROMPT[:prefix])
    uncapped = reuses(m, PROMPT, None)
    got = reuses(m, PROMPT, cap)
    assert got == min(uncapped, cap)
    assert reuses(m, PROMPT, cap + 1) >= got


@pytest.mark.requires("ssm_layers")
def test_cap_falls_back_to_an_earlier_snapshot(backend: kv_api.Backend) -> None:
    """With SSM layers a state is valid at one length only: under a cap the match ends at the
    widest snapshot within it (here the block ends, each committed with its snapshot)."""
    kv = [BufferConfig("key", 4096), BufferConfig("value", 4096)]
    layers: list[AttentionLayerConfig | SsmLayerConfig] = [
        AttentionLayerConfig(0, kv),
        SsmLayerConfig(1, [BufferConfig("conv", 1024), BufferConfig("state", 4096)]),
    ]
    m = backend.KVCacheManager(
        KVCacheManagerConfig(TPB, [GpuCacheTierConfig(8 * MIB)], layers, commit_min_snapshot=True)
    )
    cache = m.create_kv_cache(None, [])
    assert cache.resume() and cache.resize(20)
    for start in range(0, 20, TPB):  # a snapshot at every block end
        cache.commit(PROMPT[start : start + TPB])
    cache.close()
    assert reuses(m, PROMPT, None) == 20
    for cap in range(24):
        assert reuses(m, PROMPT, cap) == min(20, cap // TPB * TPB), cap


def refused(m: kv_api.KVCacheManager, call: Callable[[], object]) -> tuple[str, str, list[str]]:
    """``call()`` raises a TypeError or ValueError and changes nothing; what it raised."""
    before = snapshot(m, [], [(None, PROMPT)]), m.num_open_kv_caches
    with pytest.raises((TypeError, ValueError)) as info:
        call()
    assert (snapshot(m, [], [(None, PROMPT)]), m.num_open_kv_caches) == before
    return type(info.value).__name__, str(info.value), getattr(info.value, "__notes__", [])


def bad_calls(m: kv_api.KVCacheManager) -> dict[str, Callable[[], object]]:
    any_m: Any = m  # the calls are given what their types refuse
    calls: dict[str, Callable[[], object]] = {
        "caps shorter": lambda: m.admit_many([None, None], [PROMPT, PROMPT], max_reused_tokens=[3]),
        "caps a str": lambda: any_m.admit_many([None], [PROMPT], max_reused_tokens="3"),
    }
    caps: tuple[Any, ...] = (-1, 1 << 41, "3", 2.0, True)
    for cap in caps:
        calls[f"create_kv_cache {cap!r}"] = partial(any_m.create_kv_cache, None, PROMPT, max_reused_tokens=cap)
        calls[f"probe_reuse {cap!r}"] = partial(any_m.probe_reuse, None, PROMPT, cap)
        calls[f"probe_reuse_match {cap!r}"] = partial(any_m.probe_reuse_match, None, PROMPT, cap)
        calls[f"probe_first_new_block_key {cap!r}"] = partial(any_m.probe_first_new_block_key, None, PROMPT, cap)
        calls[f"admit_many {cap!r}"] = partial(
            any_m.admit_many, [None, None], [PROMPT] * 2, max_reused_tokens=[None, cap]
        )
    return calls


def test_bad_caps_change_nothing(backends: list[kv_api.Backend]) -> None:
    """Every call refuses a bad cap alike (the same class and message on every backend) and
    changes nothing; ``admit_many``'s item errors name the item."""
    seen = []
    for backend in backends:
        m = make_manager(backend, make_config(TPB, slots=32))
        committed(m, PROMPT)
        out = {name: refused(m, call) for name, call in bad_calls(m).items()}
        assert out["probe_reuse -1"][:2] == ("ValueError", "max_reused_tokens: must be in [0, 1099511627776) (got -1)")
        assert out["create_kv_cache True"][:2] == ("TypeError", "max_reused_tokens: expected an int, got bool")
        assert out["admit_many '3'"][2] == ["admit_many: in max_reused_tokens[1]; nothing changed"]
        assert out["caps shorter"] == ("ValueError", "max_reused_tokens: 1 items for 2 reuse_scopes", [])
        assert out["caps a str"] == ("TypeError", "max_reused_tokens: expected a list or tuple, got str", [])
        seen.append(out)
    assert all(s == seen[0] for s in seen)
