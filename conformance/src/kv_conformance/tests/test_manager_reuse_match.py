"""Reuse diagnostics (issue 12, item 5; docs/manager.md, "Reuse"): ``probe_reuse_match`` gives
the tokens looked up, walked before the divergence, kept by attention and reused (a hybrid's SSM
state only where a snapshot is, after the back-off), in that order, the reused ones being
``probe_reuse``'s, alike on every backend; bad arguments are refused.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kv_api
from kv_api import ReuseMatch
from kv_api.errors import InvalidStateError

from ._manager import make_config, raises_exactly, ssm_hybrid, toks, with_two_snapshots

BAD_SCOPE: Any = "scope"  # not a ReuseScope


@pytest.mark.requires("ssm_layers")
def test_reuse_match_diagnostics_hybrid(backend: kv_api.Backend) -> None:
    """Snapshots in block 1 (after 8 tokens) and in the partial tail [8, 9]: a prompt diverging
    after token 8 walks 9 tokens, attention keeps 9 (the tail's pages cover 2), the SSM state is
    only valid at 8."""
    m = with_two_snapshots(backend)
    assert m.probe_reuse_match(None, [*toks(9), 99]) == ReuseMatch(10, 9, 9, 8)
    assert m.probe_reuse_match(None, toks(12)) == ReuseMatch(12, 10, 10, 10)
    assert m.probe_reuse_match(None, toks(6)) == ReuseMatch(6, 6, 6, 0)  # no snapshot at 6
    assert m.probe_reuse_match() == ReuseMatch(0, 0, 0, 0)


def test_reuse_match_diagnostics_backoff(backend: kv_api.Backend) -> None:
    m = backend.KVCacheManager(make_config(4, slots=16, reuse_match_backoff=3))
    c = m.create_kv_cache()
    assert c.resume() and c.resize(12)
    c.commit(toks(12))
    c.close()
    assert m.probe_reuse_match(None, toks(14)) == ReuseMatch(14, 12, 9, 9)
    assert m.probe_reuse(None, toks(14)) == 9


def test_reuse_match_bad_arguments(backends: list[kv_api.Backend]) -> None:
    for b in backends:
        m = b.KVCacheManager(make_config())
        e = raises_exactly(TypeError, partial(m.probe_reuse_match, BAD_SCOPE, [1]))
        assert str(e) == "reuse_scope: expected ReuseScope or None, got str"
        e = raises_exactly(ValueError, partial(m.probe_reuse_match, None, [-1]))
        assert str(e).startswith("token 0: id -1 out of range")
        m.shutdown()
        raises_exactly(InvalidStateError, partial(m.probe_reuse_match, None, [1]))


PROMPTS = st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=18), min_size=1, max_size=5)


@pytest.mark.requires("ssm_layers")
@given(
    prompts=PROMPTS,
    chunks=st.lists(st.integers(1, 7), min_size=1, max_size=6),
    probes=st.lists(st.lists(st.integers(0, 2), max_size=20), min_size=1, max_size=6),
    backoff=st.integers(0, 5),
    window=st.integers(3, 12),
)
@settings(max_examples=40, deadline=None)
def test_reuse_match_order_property(
    backends: list[kv_api.Backend],
    prompts: list[list[int]],
    chunks: list[int],
    probes: list[list[int]],
    backoff: int,
    window: int,
) -> None:
    """reuse <= attention <= divergence <= lookup; reuse is probe_reuse; both backends agree."""
    results = []
    for b in backends:
        m = b.KVCacheManager(ssm_hybrid(window=window, reuse_match_backoff=backoff))
        for i, prompt in enumerate(prompts):
            c = m.create_kv_cache(None, prompt)
            assert c.resume() and c.resize(len(prompt))
            at, k = c.num_committed_tokens, 0
            while at < len(prompt):
                step = chunks[k % len(chunks)]
                c.commit(prompt[at : at + step], is_end=at + step >= len(prompt) and i % 2 == 0)
                at, k = at + step, k + 1
            c.close()
        got = []
        for probe in probes:
            r = m.probe_reuse_match(None, probe)
            assert r.num_reused_tokens <= r.num_attention_tokens <= r.num_divergence_tokens <= r.num_lookup_tokens
            assert r.num_lookup_tokens == len(probe)
            assert r.num_reused_tokens == m.probe_reuse(None, probe)
            got.append(r)
        results.append(got)
    assert all(r == results[0] for r in results)
