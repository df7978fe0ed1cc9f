"""One manager, several threads: creating, resuming, committing, suspending and closing caches
concurrently raises nothing unexpected and leaves consistent accounting."""

from __future__ import annotations

import random
import sys
import threading
import time
from array import array
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

import kv_api
from kv_api import BAD_PAGE_INDEX, KVCacheStatus

from ._manager import (
    check_accounting,
    check_indices,
    check_lengths,
    hybrid_config,
    make_config,
    make_manager,
    toks,
)

TPB = 4
PROMPTS = [toks(n, 100 * p) for p in range(4) for n in (6, 13, 20)]


def worker(manager: Any, seed: int, rounds: int) -> int:
    """Run ``rounds`` requests; return how many completed (resume and resizes may be refused)."""
    rng = random.Random(seed)
    done = 0
    for _ in range(rounds):
        prompt = rng.choice(PROMPTS)
        cache = manager.create_kv_cache(None, prompt)
        try:
            check_lengths(cache)
            if not cache.resume():
                continue
            if not cache.resize(len(prompt) + 4):
                continue
            cache.commit(prompt[cache.num_committed_tokens :])
            for step in range(rng.randrange(4)):
                if rng.random() < 0.3:
                    cache.suspend()
                    if not cache.resume():
                        break
                cache.commit([7000 + seed * 10 + step])
                check_lengths(cache)
                if cache.status == KVCacheStatus.ACTIVE:
                    check_indices(manager, cache)
            done += 1
        finally:
            cache.close()
    return done


def test_concurrent_requests(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, hybrid_config(TPB, slots=32, window=8, max_util_for_resume=1.0))
    stop = threading.Event()
    errors: list[BaseException] = []

    def watch() -> None:
        while not stop.is_set():
            try:
                check_accounting(manager)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                return

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with ThreadPoolExecutor(4) as pool:
            completed = list(pool.map(lambda s: worker(manager, s, 100), range(4)))
    finally:
        stop.set()
        watcher.join()
    assert not errors, errors[0]
    assert sum(completed) > 0
    check_accounting(manager, open_caches=False)
    # Every prompt is reusable up to what the tree holds, and probes agree with creates.
    for prompt in PROMPTS:
        cache = manager.create_kv_cache(None, prompt)
        assert cache.num_committed_tokens == manager.probe_reuse(None, prompt)
        cache.close()
    manager.clear_reusable_blocks()
    stats = manager.get_storage_statistics()
    assert [(s.free, s.evictable) for s in stats] == [(s.total, 0) for s in stats]


@pytest.mark.requires("native_buffers")
def longest_stall(work: Any) -> float:
    """The longest this thread went without the GIL while another thread ran ``work()``, with a
    short switch interval (handing the GIL back and forth around a call of a few milliseconds at
    the default 5 ms would be a stall of that order by itself)."""
    done = threading.Event()

    def run() -> None:
        work()
        done.set()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.0002)
    try:
        thread = threading.Thread(target=run)
        last, longest = time.perf_counter(), 0.0
        thread.start()
        while not done.is_set():
            now = time.perf_counter()
            longest, last = max(longest, now - last), now
        thread.join()
    finally:
        sys.setswitchinterval(interval)
    return longest


def test_matching_releases_the_gil(backend: kv_api.Backend) -> None:
    """A long probe (hashing and matching 8M cached tokens) leaves other Python threads running."""
    # Long enough (tens of milliseconds) that being descheduled for a time slice on a loaded
    # machine is well below half of it.
    tokens = np.arange(1 << 23, dtype=np.int32)
    manager = backend.KVCacheManager(make_config(tokens_per_block=32, slots=(1 << 23) // 32 + 64))
    cache = manager.create_kv_cache(None, [])
    assert cache.resume() and cache.resize(len(tokens))
    cache.commit(tokens)
    cache.close()
    start = time.perf_counter()
    manager.probe_reuse(None, tokens)
    alone = time.perf_counter() - start
    # A probe holding the GIL stalls this thread for all of it, every time; a busy machine can
    # deschedule it once in a while, so the best of three attempts is judged.
    longest = min(longest_stall(lambda: manager.probe_reuse(None, tokens)) for _ in range(3))
    assert longest < alone / 2, f"main thread stalled {longest:.4f}s of a {alone:.4f}s probe"


def test_a_long_commit_releases_the_gil(backend: kv_api.Backend) -> None:
    """A long commit (hashing 1M tokens into the tree) leaves other Python threads running, on a
    manager whose pages never move (where a decode step's short commit may keep the GIL)."""
    tokens = np.arange(1 << 20, dtype=np.int32)
    manager = backend.KVCacheManager(make_config(tokens_per_block=32, slots=2 * ((1 << 20) // 32) + 64))
    salts = iter(range(1_000_000))
    seconds: list[float] = []  # of each commit call

    def commit() -> None:
        cache = manager.create_kv_cache(kv_api.ReuseScope(salt=next(salts)), [])
        assert cache.resume() and cache.resize(len(tokens))
        start = time.perf_counter()
        cache.commit(tokens)
        seconds.append(time.perf_counter() - start)
        cache.close()

    # Each try's stall against that try's commit (the same call in the same state of the
    # machine): a commit holding the GIL stalls this thread for all of it; the best of three.
    ratios = [longest_stall(commit) / seconds[-1] for _ in range(3)]
    assert min(ratios) < 0.5, f"main thread stalled {min(ratios):.0%} of a commit"


@pytest.mark.requires("remote_tier")
def test_a_write_through_releases_the_gil(backend: kv_api.Backend) -> None:
    """A decode step's one-token commit that fills a block, on a manager with a remote tier,
    writes the block through (its 16 MiB of pages copied and checksummed): other Python threads
    keep running. (The steps that fill none may keep the GIL: docs/manager.md, "Threads and the
    GIL".)"""
    tpb, page = 16, 8 << 20  # each buffer's page: a 16 MiB value per block
    layers = [kv_api.AttentionLayerConfig(0, [kv_api.BufferConfig("key", page), kv_api.BufferConfig("value", page)])]
    store = kv_api.MemoryBlockStore()
    tiers: list[kv_api.CacheTierConfig] = [
        kv_api.GpuCacheTierConfig(8 * 2 * page),
        kv_api.RemoteCacheTierConfig(store, "m"),
    ]
    manager = backend.KVCacheManager(kv_api.KVCacheManagerConfig(tpb, tiers, layers))
    seconds: list[float] = []  # of each block-filling commit
    first = iter(range(0, 1 << 30, tpb))

    def fill() -> None:
        cache = manager.create_kv_cache(None, [])
        assert cache.resume() and cache.resize(tpb)
        base = next(first)
        cache.commit(list(range(base, base + tpb - 1)))
        start = time.perf_counter()
        cache.commit([base + tpb - 1])  # the block is full: written through
        seconds.append(time.perf_counter() - start)
        cache.close()

    # Without the GIL the stall is the store's Python call (its copy of the value): about a third
    # of the commit here; holding it, all of the commit (99% with the binding made to keep it).
    ratios = [longest_stall(fill) / seconds[-1] for _ in range(3)]
    assert len(store.values) == 3  # each try wrote its block
    assert min(ratios) < 0.75, f"main thread stalled {min(ratios):.0%} of a write-through"


def test_index_buffers_race_resize_and_close(backend: kv_api.Backend) -> None:
    """Threads attach, detach and read index buffers while others resize and close the same caches
    (a regression: attaching changed the buffers a resize or close was writing through, without the
    manager's lock; the native backend crashed within 0.2 s). Only the documented refusals may be
    raised, and the manager's accounting and the buffers stay consistent."""
    manager = make_manager(backend, hybrid_config(TPB, slots=64, window=8, max_util_for_resume=1.0))
    groups = len(manager.life_cycles)
    caches: list[Any] = [None] * 4
    replace = threading.Lock()  # swaps a closed cache for a new one; the manager's calls race freely
    errors: list[BaseException] = []
    deadline = time.monotonic() + 1.5
    calls = [0] * 6

    def fresh(i: int) -> None:
        cache = manager.create_kv_cache(None, [])
        assert cache.resume()
        with replace:
            if caches[i] is None or caches[i].status == KVCacheStatus.CLOSED:
                caches[i] = cache
                return
        cache.close()

    def work(seed: int) -> None:
        rng = random.Random(seed)
        try:
            while time.monotonic() < deadline:
                i = rng.randrange(len(caches))
                cache, lg = caches[i], rng.randrange(groups)
                action = rng.randrange(6)
                calls[action] += 1
                try:
                    if action == 0:  # a buffer longer or shorter than the cache's blocks
                        cache.set_base_page_index_buf(0, lg, array("i", [12345] * rng.randrange(48)))
                    elif action == 1:
                        cache.set_base_page_index_buf(0, lg, None)
                    elif action == 2:
                        indices = cache.get_base_page_indices(lg)
                        assert all(-1 <= x < 64 for x in indices), list(indices)
                    elif action == 3:
                        cache.resize(rng.randrange(cache.history_length, 48) if rng.random() < 0.9 else 200)
                    elif action == 4:
                        cache.close()
                        fresh(i)
                    else:
                        cache.commit(toks(rng.randrange(3), 10 * seed))
                except (kv_api.errors.InvalidStateError, ValueError):
                    pass  # closed or suspended meanwhile, a buffer too short, a stale length
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    for i in range(len(caches)):
        fresh(i)
    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert min(calls) > 0, calls
    check_accounting(manager)
    for cache in caches:  # quiet now: an attached buffer is the indices, then -1
        if cache.status != KVCacheStatus.ACTIVE:
            continue
        check_indices(manager, cache)
        buf = array("i", [7] * (cache.num_blocks + 3))
        cache.set_base_page_index_buf(0, 0, buf)
        assert list(buf) == [*cache.get_base_page_indices(0), BAD_PAGE_INDEX, BAD_PAGE_INDEX, BAD_PAGE_INDEX]
        cache.close()
    check_accounting(manager, open_caches=False)
