"""Tokens reach the manager through the block-key ingestion: every container, the same errors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import kv_api
from kv_api import keys as ref

from ._manager import make_config, snapshot
from ._tokens import INT_CONTAINERS

IDS = [(i * 37 + 11) % 1000 for i in range(30)]


def committed_manager(backend: kv_api.Backend) -> Any:
    manager = backend.KVCacheManager(make_config(slots=32))
    cache = manager.create_kv_cache(None, [])
    assert cache.resume() and cache.resize(len(IDS))
    cache.commit(IDS)
    cache.close()
    return manager


@pytest.mark.parametrize("container", sorted(INT_CONTAINERS))
def test_every_container_matches(backend: kv_api.Backend, container: str) -> None:
    manager = committed_manager(backend)
    make = INT_CONTAINERS[container]
    assert manager.probe_reuse(None, make(IDS)) == len(IDS)
    assert (
        manager.probe_first_new_block_key(None, make([*IDS, 1, 2, 3, 4]))
        == ref.block_keys(4, None, [*IDS, 1, 2, 3, 4])[8 * 32 : 9 * 32]  # block 30 // 4 = 7
    )
    cache = manager.create_kv_cache(None, make(IDS[:17]))
    assert cache.num_committed_tokens == 17 and cache.committed_tokens == IDS[:17]
    assert cache.resume() and cache.resize(24)
    cache.commit(make([5, 6, 7]))
    assert cache.committed_tokens == [*IDS[:17], 5, 6, 7]
    cache.close()


@pytest.mark.parametrize(
    "tokens",
    [[1, -1], [True], [1.5], [b"x" * 31], "abc", 7, [2**31]],
    ids=["negative", "bool", "float", "short digest", "str", "int", "too large"],
)
def test_bad_tokens_change_nothing(backend: kv_api.Backend, tokens: Any) -> None:
    manager = committed_manager(backend)
    expected: tuple[type[BaseException], str] | None = None
    try:
        ref.block_keys(4, None, tokens)
    except (TypeError, ValueError) as exc:
        expected = (type(exc), str(exc))
    assert expected is not None
    cache = manager.create_kv_cache(None, IDS[:8])
    assert cache.resume() and cache.resize(16)
    before = snapshot(manager, [cache], probes=[(None, IDS)])
    calls: list[Callable[[], object]] = [
        lambda: manager.create_kv_cache(None, tokens),
        lambda: manager.probe_reuse(None, tokens),
        lambda: manager.probe_first_new_block_key(None, tokens),
        lambda: cache.commit(tokens),
    ]
    for call in calls:
        with pytest.raises(expected[0]) as info:
            call()
        assert (type(info.value), str(info.value)) == expected
    assert snapshot(manager, [cache], probes=[(None, IDS)]) == before
    cache.close()
