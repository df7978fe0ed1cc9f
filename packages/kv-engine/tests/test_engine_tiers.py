"""Reuse from the host and disk levels, and across device quota resizes: the prefix a request
reuses was pushed off the device level (by other requests' pages, or by a shrink), kvcore brings
it back on ``resume``, and the outputs are still exactly ``generate``'s (float64).

The device level is at least one 2 MiB grain per pool (``device_quota=1`` asks for that floor):
tiny Llama in float64 keeps 1 KiB of K/V per token, a block's page (2 layers, keys and values)
16 KiB, so 128 blocks (2048 tokens); Falcon-H1 (the hybrid) has 6 MiB: 128 K/V slots, and 128
state slots over a conv pool and an SSM pool. Eviction is per pool group by priority, then
first evictable first; evicted pages fall device -> host -> disk (the first ones on through a
level without room for all; the last level drops its victims): request A's pages, the first to
become evictable, are the first to fall when 2280 tokens of other prompts (144 blocks, and as
many state snapshots) pass after it.

``Output.reused_by_level`` is ``KVCache.cached_tokens_by_level`` at admission: per level, the
reused tokens found there when the request was matched, before ``resume`` moved them up (a
block counts on the coldest level of the pages it needs: its K/V, and for a hybrid the state
snapshot that ends the match).

Mutations checked once (monkeypatched, no file edited): block 0 read from block 1's page fails
every test here; Mamba layers sharing one layer's state fails the hybrid's; ``resize_device``
not rebuilding the page views fails the resize test; pages brought up from host or disk arriving
zeroed (the Python backend's page transfer) fails every test on that backend.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_reference import check, model, tokens

import kv_api
import kv_engine

SYSTEM = tokens(1, 48)
#: 53 tokens, 4 generated: 56 computed, committed as 3 blocks and a partial block of 8.
PROMPT_A = SYSTEM + tokens(2, 5)
#: What pushes A down: 3 x 760 tokens, 48 blocks each, one at a time.
TRAFFIC = [tokens(100 + i, 760) for i in range(3)]
#: The hybrid's lower levels take the device's split between pool groups, which gives the
#: states (one slot per request in the sizing request) a small share: 2 slots of a 4 MiB host
#: level, 125 of 256 MiB (reserved, not touched: only the pages that fall are written). With
#: too few, the snapshots that fall are dropped and nothing is reused although the K/V survive.
HYBRID_LOWER = 256 << 20
#: One block's page of tiny Llama in float64: 2 layers x (keys, values) x 16 tokens x 2 heads x 16.
LLAMA_PAGE = 2 * 2 * 16 * 2 * 16 * 8


def engine(backend: kv_api.Backend, name: str, **kwargs: object) -> kv_engine.Engine:
    return kv_engine.Engine(model(name), backend=backend, keep_logits=True, **kwargs)  # type: ignore[arg-type]


def run_traffic(e: kv_engine.Engine, prompts: list[list[int]] = TRAFFIC) -> None:
    for prompt in prompts:
        [out] = e.generate([prompt], max_new_tokens=1)
        assert out.reused_tokens == 0


@pytest.mark.requires("host_tier")
@pytest.mark.parametrize("name", ["llama", pytest.param("hybrid", marks=pytest.mark.requires("ssm_layers"))])
@pytest.mark.parametrize("level", [1, pytest.param(2, marks=pytest.mark.requires("disk_tier"))])
def test_reused_from_a_lower_level(backend: kv_api.Backend, name: str, level: int, tmp_path: Path) -> None:
    """A's blocks pushed to the host level (``level`` 1), or through a one-slot host level to
    disk (2), by other prompts on the smallest device level; a request sharing A's system prompt
    then finds its 48 tokens all on that level, and a turn continuing A's chat finds those 48 on
    the device again (the first request brought them up) and A's partial block of 8 still below.
    Both are exactly ``generate``'s."""
    lower = HYBRID_LOWER if name == "hybrid" else 1 << 20
    if level == 1:
        tiers: dict[str, object] = {"host_quota": lower}
    else:
        tiers = {"host_quota": 1, "disk_quota": lower, "disk_path": tmp_path}
    e = engine(backend, name, device_quota=1, **tiers)
    assert e.manager.get_quota(0) == (6 if name == "hybrid" else 2) << 20
    [a] = e.generate([PROMPT_A], max_new_tokens=4)
    run_traffic(e)

    b_prompt = SYSTEM + tokens(3, 9)
    [b] = e.generate([b_prompt], max_new_tokens=6)
    below = [0] * (level + 1)
    below[level] = 48
    assert (b.reused_tokens, b.reused_by_level) == (48, tuple(below))
    check(name, b_prompt, b)

    c_prompt = PROMPT_A + a.tokens + tokens(4, 6)
    [c] = e.generate([c_prompt], max_new_tokens=6)
    below = [48] + [0] * level
    below[level] = 8
    assert (c.reused_tokens, c.reused_by_level) == (56, tuple(below))
    # The hybrid's state at 56 went through A's decode recurrence (float32 either way), the
    # reference's through one chunked scan: about 1e-9 apart (test_engine.test_multi_turn_chat).
    check(name, c_prompt, c, 1e-6 if name == "hybrid" else 0.0)
    assert e.manager.get_bytes_moved().get((level, 0), 0) > 0


@pytest.mark.requires("host_tier")
def test_device_resized(backend: kv_api.Backend) -> None:
    """A device level of 4 MiB (256 blocks) holds A and the traffic (148 blocks). Between
    ``generate`` calls every cache is closed, so the level can be resized: shrunk to 2 MiB, the
    20 oldest pages (A's first) fall to the host and the 20 in slots 128 and up move below 128
    (the pools are remapped: ``layout_version`` moves and the views are rebuilt). A request sharing A's
    prompt then reuses it from the host, one continuing the last traffic prompt reuses its
    moved pages on the device, both exact. A resize below the minimum (one 2 MiB grain) fails
    and changes nothing; growing to 8 MiB keeps every page. Every output is exact."""
    e = engine(backend, "llama", device_quota=4 << 20, host_quota=1 << 20)
    [a] = e.generate([PROMPT_A], max_new_tokens=4)
    run_traffic(e)
    assert e.manager.get_storage_statistics(0)[0].free == 256 - 4 - 3 * 48

    assert e.resize_device(2 << 20)
    assert e.manager.get_quota(0) == 2 << 20
    assert e.manager.get_bytes_moved() == {(0, 1): 20 * LLAMA_PAGE, (0, 0): 20 * LLAMA_PAGE}
    b_prompt = SYSTEM + tokens(3, 9)
    last = TRAFFIC[-1] + tokens(5, 7)
    b, last_out = e.generate([b_prompt, last], max_new_tokens=6)
    assert (b.reused_tokens, b.reused_by_level) == (48, (0, 48))
    assert (last_out.reused_tokens, last_out.reused_by_level) == (760, (760, 0))
    check("llama", b_prompt, b)
    check("llama", last, last_out)

    assert not e.resize_device(1 << 20)
    assert e.manager.get_quota(0) == 2 << 20
    assert e.manager.get_storage_statistics(0)[0].total == 128
    c_prompt = PROMPT_A + a.tokens + tokens(4, 6)
    [c] = e.generate([c_prompt], max_new_tokens=6)
    assert (c.reused_tokens, c.reused_by_level) == (56, (48, 8))
    check("llama", c_prompt, c)

    version = e.manager.layout_version
    assert e.manager.resize(0, 8 << 20)  # on the manager directly: the engine sees layout_version move
    assert e.manager.layout_version == version + 1
    assert e.manager.get_quota(0) == 8 << 20
    d_prompt = c_prompt + c.tokens + tokens(6, 3)
    [d] = e.generate([d_prompt], max_new_tokens=6)
    held = len(c_prompt) + len(c.tokens) - 1  # all of c but its last token (never forwarded)
    assert (d.reused_tokens, d.reused_by_level) == (held, (held, 0))
    check("llama", d_prompt, d)
