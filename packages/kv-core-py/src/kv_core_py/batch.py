"""Batched calls (docs/manager.md, "Batched calls"): many caches' resize, commit or admission in
one call, exactly the single calls in order. Every argument is checked first, changing nothing
when one is bad; then the calls run in order, and the first that raises ends the batch: the
calls before it took effect, it and the later ones did not. Its exception is the single call's
with a note, ``batch_index`` (its index) and ``batch_results`` (the earlier calls' results).
The caller (the manager) holds the lock for the whole batch; kv_core_cpp's batch.cc mirrors this."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import kv_api
from kv_api._check import int_in_range
from kv_api.constants import CACHE_ID_LIMIT, TOKEN_LIMIT
from kv_api.keys import check_reuse_scope
from kv_core_py.kv_cache import KVCache
from kv_core_py.remote_tier import RemoteTier
from kv_core_py.tokens import Tokens

# The manager as the contract types it: this module sits below manager.py (no import cycle).
KVCacheManager = kv_api.KVCacheManager

_T = TypeVar("_T")


def items(where: str, value: Any) -> tuple[Any, ...]:
    """A list or tuple, copied first: what an item's ``__index__`` does to the caller's list
    afterwards changes nothing here."""
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{where}: expected a list or tuple, got {type(value).__name__}")
    return tuple(value)


def same_length(where: str, size: int, first: str, n: int) -> None:
    if size != n:
        raise ValueError(f"{where}: {size} items for {n} {first}")


def item(api: str, name: str, i: int, check: Callable[..., _T], *args: Any) -> _T:
    """``check(*args)`` (the conversion of one item); its error gets a note naming the item."""
    try:
        return check(*args)
    except BaseException as e:
        e.add_note(f"{api}: in {name}[{i}]; nothing changed")
        raise


def cache_arg(manager: KVCacheManager, cache: Any, i: int) -> KVCache:
    """``caches[i]``: one of this manager's caches."""
    if not isinstance(cache, KVCache):
        raise TypeError(f"caches[{i}]: expected this backend's KVCache, got {type(cache).__name__}")
    if cache._manager is not manager:
        raise ValueError(f"caches[{i}]: belongs to another manager")
    return cache


@contextmanager
def in_order(api: str, n: int, results: list[Any]) -> Iterator[None]:
    """Around the loop of calls: the first failure is call ``len(results)``."""
    try:
        yield
    except BaseException as e:
        k = len(results)
        e.add_note(
            f"{api}: call {k} of {n} raised this; the {k} before it took effect, it and the {n - k - 1} after it did not"
        )
        setattr(e, "batch_index", k)  # noqa: B010 (an attribute exception classes do not declare)
        setattr(e, "batch_results", list(results))  # noqa: B010
        raise


def resize_many(manager: KVCacheManager, caches: Any, capacities: Any) -> list[bool]:
    cs = items("caches", caches)
    capacity_items = items("capacities", capacities)
    same_length("capacities", len(capacity_items), "caches", len(cs))
    targets: list[KVCache] = []
    values: list[int | None] = []
    for i in range(len(cs)):
        targets.append(cache_arg(manager, cs[i], i))
        values.append(item("resize_many", "capacities", i, _optional_count, "capacity", capacity_items[i], TOKEN_LIMIT))
    return _resize_in_order(targets, values)


def _resize_in_order(targets: list[KVCache], values: list[int | None]) -> list[bool]:
    results: list[bool] = []
    with in_order("resize_many", len(targets), results):
        for cache, capacity in zip(targets, values, strict=True):
            results.append(cache.resize(capacity))
    return results


def commit_many(
    manager: KVCacheManager, caches: Any, tokens: Any, counts: Any, is_end: Any, remote: RemoteTier | None
) -> None:
    cs = items("caches", caches)
    ns = items("counts", counts)
    same_length("counts", len(ns), "caches", len(cs))
    targets: list[KVCache] = []
    sizes: list[int] = []
    for i in range(len(cs)):
        targets.append(cache_arg(manager, cs[i], i))
        sizes.append(int_in_range(f"counts[{i}]", ns[i], 0, TOKEN_LIMIT))
    toks = Tokens(tokens, manager.init_config.key_format)  # once for the batch; sliced per cache
    if sum(sizes) != len(toks):
        raise ValueError(f"counts: add up to {sum(sizes)} but tokens holds {len(toks)}")
    _commit_in_order(targets, toks, 0, sizes, bool(is_end), remote)


def _commit_in_order(
    targets: list[KVCache], toks: Tokens, begin: int, sizes: list[int], end: bool, remote: RemoteTier | None
) -> None:
    """The commits of ``commit_many``, cache ``i``'s tokens the ``sizes[i]`` from where cache
    ``i - 1``'s ended, the first from ``begin``."""
    results: list[None] = []
    # The blocks the batch's commits write through go to the store in one put, after the last.
    with in_order("commit_many", len(targets), results):
        if remote is not None:
            remote.begin_batch()
        try:
            for cache, size in zip(targets, sizes, strict=True):
                cache.commit(toks.to_list(begin, begin + size), end)
                results.append(None)
                begin += size
        finally:
            if remote is not None:
                remote.end_batch()


def decode_steps(
    manager: KVCacheManager,
    caches: Any,
    tokens: Any,
    steps: Any,
    until_room: Any,
    remote: RemoteTier | None,
    statistics: Callable[[], list[kv_api.StorageStatistics]],
) -> kv_api.DecodeSteps:
    """Iteration after iteration, ``resize_many`` to one token past what each cache committed
    (never below its capacity), then ``commit_many`` of one token each, until an iteration's
    resizes do not all succeed or it leaves more room than ``until_room`` (the contract's
    ``decode_steps``); ``statistics`` reads the device level's after each."""
    cs = items("caches", caches)
    targets = [cache_arg(manager, cs[i], i) for i in range(len(cs))]
    count = int_in_range("steps", steps, 0, TOKEN_LIMIT)
    toks = Tokens(tokens, manager.init_config.key_format)  # once for every iteration; sliced per one
    n = len(targets)
    if len(toks) != n * count:
        raise ValueError(f"tokens: holds {len(toks)} for {n} caches times {count} steps")
    room = None if until_room is None else _room_arg(until_room, len(statistics()))
    ones = [1] * n
    free: list[list[int]] = []
    evictable: list[list[int]] = []
    for k in range(count):
        with _in_iteration(k, count):
            resized = _resize_in_order(targets, [max(c.capacity, c.num_committed_tokens + 1) for c in targets])
            if not all(resized):
                return kv_api.DecodeSteps(k, resized, free, evictable)
            _commit_in_order(targets, toks, k * n, ones, False, remote)
        stats = statistics()
        free.append([s.free for s in stats])
        evictable.append([s.evictable for s in stats])
        if room is not None and any(s.free + s.evictable > r for s, r in zip(stats, room, strict=True)):
            return kv_api.DecodeSteps(k + 1, [], free, evictable)
    return kv_api.DecodeSteps(count, [], free, evictable)


def _room_arg(until_room: Any, groups: int) -> list[int]:
    """``until_room``: one slot count per pool group."""
    room = items("until_room", until_room)
    same_length("until_room", len(room), "pool groups", groups)
    return [int_in_range(f"until_room[{g}]", room[g], 0, TOKEN_LIMIT) for g in range(groups)]


@contextmanager
def _in_iteration(k: int, steps: int) -> Iterator[None]:
    try:
        yield
    except BaseException as e:
        e.add_note(f"decode_steps: in iteration {k} of {steps}; the {k} before it took effect")
        raise


def admit_many(
    manager: KVCacheManager, reuse_scopes: Any, prompts: Any, ids: Any, priority_callbacks: Any, max_reused: Any
) -> list[kv_api.KVCache]:
    scopes = items("reuse_scopes", reuse_scopes)
    ps = items("prompts", prompts)
    n = len(scopes)
    same_length("prompts", len(ps), "reuse_scopes", n)
    id_items: tuple[Any, ...] = (None,) * n
    callbacks: tuple[Any, ...] = (None,) * n
    if ids is not None:
        id_items = items("ids", ids)
        same_length("ids", len(id_items), "reuse_scopes", n)
    if priority_callbacks is not None:
        callbacks = items("priority_callbacks", priority_callbacks)
        same_length("priority_callbacks", len(callbacks), "reuse_scopes", n)
    max_reused_items: tuple[Any, ...] = (None,) * n
    if max_reused is not None:
        max_reused_items = items("max_reused_tokens", max_reused)
        same_length("max_reused_tokens", len(max_reused_items), "reuse_scopes", n)
    # create_kv_cache's order for each prompt: the callback, the scope, the tokens, the id, max_reused_tokens.
    calls: list[tuple[Any, ...]] = []
    for i in range(n):
        prompt = ps[i]
        item("admit_many", "priority_callbacks", i, _callable_or_none, callbacks[i])
        scope = item("admit_many", "reuse_scopes", i, check_reuse_scope, scopes[i])
        toks = item(
            "admit_many", "prompts", i, Tokens, [] if prompt is None else prompt, manager.init_config.key_format
        )
        cache_id = item("admit_many", "ids", i, _optional_count, "id", id_items[i], CACHE_ID_LIMIT)
        max_reused_tokens = item(
            "admit_many", "max_reused_tokens", i, _optional_count, "max_reused_tokens", max_reused_items[i], TOKEN_LIMIT
        )
        # converted once, as kv_core_cpp reads them
        calls.append((scope, toks.to_list(), cache_id, callbacks[i], max_reused_tokens))
    created: list[kv_api.KVCache] = []
    with in_order("admit_many", n, created):
        for scope, prompt, cache_id, callback, max_reused_tokens in calls:
            created.append(
                manager.create_kv_cache(scope, prompt, cache_id, callback, max_reused_tokens=max_reused_tokens)
            )
    return created


def _optional_count(where: str, value: Any, high: int) -> int | None:
    return None if value is None else int_in_range(where, value, 0, high)


def _callable_or_none(callback: Any) -> None:
    if callback is not None and not callable(callback):
        raise TypeError("custom_priority_callback: expected a callable or None")
