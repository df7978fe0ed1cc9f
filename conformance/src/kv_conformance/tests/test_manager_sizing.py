"""Sizing a manager at the edges of the ranges (docs/errors.md, "Bounded refusal"): a system
prompt of 2**40 tokens is counted in time independent of its length, and a minimum device quota
of 2**63 bytes or more (window floors times slot sizes, or constraints over
``max_util_for_resume``) is a ``HostOOMError`` before anything is allocated, the same on every
backend, never a wrapped product."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from functools import partial

import pytest

import kv_api
from kv_api import BatchDesc, KVCacheDesc, KVCacheManagerConfig
from kv_api.constants import TOKEN_LIMIT
from kv_api.errors import HostOOMError

from ._manager import GRAIN, attention, make_config, make_manager

MIN_QUOTA = "device tier: the minimum slots need 2**63 bytes or more"


def sized(backend: kv_api.Backend, config: KVCacheManagerConfig) -> tuple[object, ...]:
    """What construction gives: the quota and slots, or the error's class and message."""
    try:
        manager = make_manager(backend, config)
    except Exception as exc:  # noqa: BLE001 - the class and message are what we compare
        return type(exc), str(exc)
    return manager.get_quota(), [s.total for s in manager.get_storage_statistics()]


def agree(backends: list[kv_api.Backend], config: Callable[[], KVCacheManagerConfig]) -> tuple[object, ...]:
    """Every backend's outcome, identical and within a second each; returns it."""
    seen = []
    for backend in backends:
        start = time.perf_counter()
        seen.append(sized(backend, config()))
        assert time.perf_counter() - start < 1.0, backend.name
    assert all(s == seen[0] for s in seen), seen
    return seen[0]


def test_a_system_prompt_of_2_40_tokens_is_counted_at_once(backends: list[kv_api.Backend]) -> None:
    """Three requests share a 2**40-token system prompt whose blocks all but a window's are
    stale: 2**38 blocks each, counted as ranges (was a loop over every block)."""
    n = TOKEN_LIMIT - 1
    constraints = [
        BatchDesc([KVCacheDesc(n, n), KVCacheDesc(n, n - 4), KVCacheDesc(n, n - 100)], system_prompt_length=n)
    ]
    config = partial(make_config, 4, layers=[attention(0, GRAIN // 16, 8)], constraints=constraints)
    _, slots = agree(backends, config)
    assert isinstance(slots, list) and slots[0] < 64  # a few live blocks per request, not 2**38


@pytest.mark.parametrize(
    "config",
    [
        # A 2**40-slot floor (1 sink block + the window's 2**40 - 2 + 1) times 2**24-byte slots is
        # 2**64: a wrapping product read 0 and sized the tier from the requested quota.
        partial(make_config, 1, layers=[attention(0, 2**24, TOKEN_LIMIT - 1, 1)]),
        # Just past: a floor of 2**40 - 1 slots of 2**23 + 2 bytes.
        partial(make_config, 1, layers=[attention(0, 2**23 + 2, TOKEN_LIMIT - 1)]),
        # One request's 2 slots over the smallest utilisation: an infinite float.
        partial(make_config, 4, constraints=[BatchDesc([KVCacheDesc(8, 8)])], max_util_for_resume=5e-324),
        # A finite one of 2**63 slots or more.
        partial(make_config, 4, constraints=[BatchDesc([KVCacheDesc(8, 8)])], max_util_for_resume=2.0**-62),
    ],
    ids=["window x slot = 2**64", "window x slot > 2**63", "need / util = inf", "need / util >= 2**63"],
)
def test_a_minimum_quota_of_2_63_bytes_is_refused_alike(
    backends: list[kv_api.Backend], config: Callable[[], KVCacheManagerConfig]
) -> None:
    assert agree(backends, config) == (HostOOMError, MIN_QUOTA)


def test_constraints_below_the_limit_still_size_the_tier(backends: list[kv_api.Backend]) -> None:
    """The check refuses only the impossible: a small utilisation that still fits sizes alike."""
    config = partial(make_config, 4, constraints=[BatchDesc([KVCacheDesc(8, 8)])], max_util_for_resume=2.0**-10)
    _, slots = agree(backends, config)
    assert isinstance(slots, list) and slots[0] >= 2 * 2**10


def test_random_constraints_size_alike(backends: list[kv_api.Backend]) -> None:
    """Small random constraint batches (shared system prompts, windows, sinks) with a quota of
    one byte, so the minimum the ranges count decides the quota and the slots."""
    rng = random.Random(10)
    layers = [attention(0, 4096), attention(1, 2048, 8), attention(2, 4096, 5, 3)]
    for _ in range(60):
        descs = []
        for _ in range(rng.randint(1, 4)):
            capacity = rng.randint(0, 60)
            descs.append(KVCacheDesc(capacity, rng.randint(0, capacity)))
        batch = BatchDesc(descs, system_prompt_length=rng.randint(0, 70))
        agree(backends, partial(make_config, rng.choice([1, 3, 4]), layers=layers, quota=1, constraints=[batch]))


def test_typical_step_weights_beyond_64_bits_split_alike(backends: list[kv_api.Backend]) -> None:
    """A typical step of 2**40-token requests over 2**31-byte slots weighs some 2**75 bytes per
    pool group: the split takes the weights as doubles (multiplied, then added in order) on
    every backend, never as a wrapped 64-bit product. Two pool groups (full attention and a
    window of another slot size) take shares in proportion to their bytes."""
    n = TOKEN_LIMIT - 1
    step = BatchDesc([KVCacheDesc(n, n - 1), KVCacheDesc(n, 0)])
    layers = [attention(0, 2**31), attention(1, 2**30 + 4096, 64)]
    config = partial(make_config, 4, layers=layers, quota=64 * 2**31, typical_step=step)
    _, slots = agree(backends, config)
    assert isinstance(slots, list) and len(slots) == 2
    # Full attention needs every block of both requests, the window a few: most go to group 0.
    assert slots[0] > slots[1] > 0


def test_one_block_of_every_layer_is_below_2_63_bytes() -> None:
    """A slot that no quota could hold is refused when the config is built: eight layers of
    2**40-byte buffers expanded 2**19 times (tokens per block over the override) are 2**62
    bytes, sixteen are 2**63."""
    tpb = 2**19

    def layers(n: int) -> list[kv_api.AttentionLayerConfig]:
        return [kv_api.AttentionLayerConfig(i, [kv_api.BufferConfig("k", 2**40 - 1, 1)]) for i in range(n)]

    make_config(tpb, layers=layers(8))
    with pytest.raises(ValueError, match=r"one block of every layer's buffers needs 2\*\*63 bytes or more"):
        make_config(tpb, layers=layers(17))
