"""Tier benchmark: moving pages between cache levels against the raw copies of the same bytes,
and the hot path with tiers configured against without, per backend, side by side in one run.

- device -> host: a suspended cache's pages evicted by another cache's allocation, against
  ``memcpy`` of the same bytes between two already-touched buffers; host -> device: its
  ``resume()`` bringing them back.
- device -> disk and disk -> device (a manager with a disk tier below the device, which is
  host memory here): the same two moves, against ``pwrite``/``pread`` of the same bytes on the
  same file system; disk -> device also cold (the file's pages dropped from the page cache
  first, both sides), where the read comes from the device and the pages' checksums (issue 22)
  are measured against real disk reads rather than memory copies.
- decode step and cached admission (bench_manager's) with a host and a disk tier configured,
  against the device level alone.

Each figure is the best of ``--repeat`` rounds, each the second of two cycles on one manager,
so the pools and disk blocks are touched ones, as the raw copies' buffers and file are; and
the first cycle's device -> host, into host memory never written, against ``memcpy`` into a
fresh mapping (first touch: a page fault per page) and between touched buffers.
"""

from __future__ import annotations

import argparse
import mmap
import os
import tempfile
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
from bench_manager import measure as measure_manager

import kv_api
from kv_api import (
    AttentionLayerConfig,
    BufferConfig,
    CacheTierConfig,
    DiskCacheTierConfig,
    GpuCacheTierConfig,
    HostCacheTierConfig,
    KVCacheManagerConfig,
)

TPB = 16
MIB = 1 << 20


def tier_config(pages: int, page_bytes: int, below: str, path: str) -> KVCacheManagerConfig:
    """One layer whose slot is ``page_bytes``; the device and the level ``below`` it (host or
    disk) hold ``pages`` pages each."""
    half = [BufferConfig("key", page_bytes // 2), BufferConfig("value", page_bytes // 2)]
    size = pages * page_bytes
    tier: CacheTierConfig = HostCacheTierConfig(size) if below == "host" else DiskCacheTierConfig(size, path)
    return KVCacheManagerConfig(
        tokens_per_block=TPB, cache_tiers=[GpuCacheTierConfig(size), tier], layers=[AttentionLayerConfig(0, half)]
    )


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def active(manager: Any) -> Any:
    cache = manager.create_kv_cache()
    assert cache.resume()
    return cache


def drop_cached(path: str) -> None:
    """Evict the pages of every file this process has open in ``path`` from the page cache (the
    disk tier's files have no name: found by their descriptors)."""
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(f"{path}/"):
            os.fsync(int(fd))  # only clean pages are dropped
            os.posix_fadvise(int(fd), 0, 0, os.POSIX_FADV_DONTNEED)


def tier_round(backend: kv_api.Backend, pages: int, page_bytes: int, below: str, path: str) -> dict[str, float]:
    """Seconds a suspended cache's pages take to fall to the level below (another cache's
    allocation evicts them) and to come back (its ``resume()``); the second of two cycles on
    one manager, so memory and disk blocks are touched ones, as the raw copies' are."""
    m = backend.KVCacheManager(tier_config(pages, page_bytes, below, path))
    memory = np.frombuffer(m.pool_memory(0, 0), dtype=np.uint8)
    slot = m.pool_group_descs[0].pools[0].slot_size
    out: dict[str, float] = {}
    for cycle in range(2):
        a = active(m)
        assert a.resize(pages * TPB)
        for s in a.get_base_page_indices(0):
            memory[s * slot : (s + 1) * slot] = cycle + 1
        a.suspend()
        b = active(m)
        # The first cycle's pages fall into host memory never written before.
        out["down_first" if cycle == 0 else "down"] = timed(partial(b.resize, pages * TPB))
        assert b.num_blocks == pages and list(a.get_page_levels(0)) == [1] * pages
        b.close()
        cold = below == "disk" and cycle == 0  # the first way up reads from the device
        if cold:
            drop_cached(path)
        out["up_cold" if cold else "up"] = timed(a.resume)
        assert list(a.get_page_levels(0)) == [0] * pages
        assert list(a.get_page_levels(0)) == [0] * pages
        assert all(memory[s * slot] == cycle + 1 for s in a.get_base_page_indices(0))
        a.close()
    assert m.get_bytes_moved() == {(0, 1): 2 * pages * page_bytes, (1, 0): 2 * pages * page_bytes}
    del memory
    m.shutdown()
    return out


def memcpy_into_fresh(src: np.ndarray) -> float:
    """memcpy into an anonymous mapping never written before: every page faults in."""
    fresh = mmap.mmap(-1, src.size, flags=mmap.MAP_PRIVATE)
    into = np.frombuffer(fresh, dtype=np.uint8)
    start = time.perf_counter()
    np.copyto(into, src)
    seconds = time.perf_counter() - start
    del into  # a view must go before its mapping closes
    fresh.close()
    return seconds


def raw_round(size: int, path: str) -> dict[str, float]:
    """memcpy between touched buffers; pwrite (over blocks written once before) and pread of a
    file on the same file system."""
    src = np.full(size, 1, dtype=np.uint8)
    dst = np.full(size, 2, dtype=np.uint8)
    out = {"memcpy": timed(lambda: np.copyto(dst, src))}
    out["memcpy_fresh"] = memcpy_into_fresh(src)
    fd, name = tempfile.mkstemp(dir=path)
    try:
        write_all(fd, src.data)
        out["pwrite"] = timed(lambda: write_all(fd, src.data))
        out["pread"] = timed(lambda: read_all(fd, dst.data))
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        out["pread_cold"] = timed(lambda: read_all(fd, dst.data))
    finally:
        os.close(fd)
        os.unlink(name)
    return out


def write_all(fd: int, data: memoryview) -> None:
    done = 0
    while done < len(data):
        done += os.pwrite(fd, data[done:], done)


def read_all(fd: int, into: memoryview) -> None:
    done = 0
    while done < len(into):
        done += os.preadv(fd, [into[done:]], done)


def best(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {k: min(r[k] for r in rounds) for k in rounds[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=1024, help="MiB moved each way (default: 1024)")
    parser.add_argument("--page-kib", type=int, default=1024, help="KiB per page (default: 1024)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--disk-path", default=tempfile.gettempdir(), help="directory of the disk tier and raw I/O")
    parser.add_argument("--tokens", type=int, default=100_000, help="prompt length of the hot-path figures")
    parser.add_argument("--backend", action="append", help="backends to measure (default: every installed one)")
    args = parser.parse_args()
    page_bytes = args.page_kib << 10
    pages = args.size * MIB // page_bytes
    size = pages * page_bytes
    raw = best([raw_round(size, args.disk_path) for _ in range(args.repeat)])
    print(f"{pages} pages of {args.page_kib} KiB ({size / 2**30:.2f} GiB) each way; disk tier in {args.disk_path}\n")
    print(
        f"raw, same bytes: memcpy {raw['memcpy'] * 1e3:.0f} ms, pwrite {raw['pwrite'] * 1e3:.0f} ms, "
        f"pread {raw['pread'] * 1e3:.0f} ms, cold pread {raw['pread_cold'] * 1e3:.0f} ms; "
        f"memcpy into memory never written {raw['memcpy_fresh'] * 1e3:.0f} ms\n"
    )
    print(
        "| backend | device->host (ms) | x memcpy | host->device (ms) | x memcpy "
        "| device->disk (ms) | x pwrite | disk->device (ms) | x pread | cold (ms) | x cold pread |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    tokens = np.random.default_rng(0).integers(0, 2**31, args.tokens, dtype=np.int32)
    hot: dict[str, tuple[dict[str, float], dict[str, float]]] = {}
    first: dict[str, float] = {}
    for name in args.backend or kv_api.available_backends():
        backend = kv_api.load_backend(name)
        host = best([tier_round(backend, pages, page_bytes, "host", args.disk_path) for _ in range(args.repeat)])
        first[name] = host["down_first"]
        disk = best([tier_round(backend, pages, page_bytes, "disk", args.disk_path) for _ in range(args.repeat)])
        print(
            f"| {name} | {host['down'] * 1e3:.0f} | {host['down'] / raw['memcpy']:.2f} | "
            f"{host['up'] * 1e3:.0f} | {host['up'] / raw['memcpy']:.2f} | "
            f"{disk['down'] * 1e3:.0f} | {disk['down'] / raw['pwrite']:.2f} | "
            f"{disk['up'] * 1e3:.0f} | {disk['up'] / raw['pread']:.2f} | "
            f"{disk['up_cold'] * 1e3:.0f} | {disk['up_cold'] / raw['pread_cold']:.2f} |"
        )
        hot[name] = (
            measure_manager(backend, tokens, 32, args.repeat, 2000),
            measure_manager(backend, tokens, 32, args.repeat, 2000, tiers_in=args.disk_path),
        )
    print("\n| backend | device->host, host memory never written (ms) | x memcpy | x memcpy into it |")
    print("|---|---|---|---|")
    for name, t in first.items():
        print(f"| {name} | {t * 1e3:.0f} | {t / raw['memcpy']:.2f} | {t / raw['memcpy_fresh']:.2f} |")
    print(
        "\n| backend | cached admission (ms), device only | with host + disk | x "
        "| decode step (us), device only | with host + disk | x |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, (plain, tiered) in hot.items():
        print(
            f"| {name} | {plain['cached'] * 1e3:.2f} | {tiered['cached'] * 1e3:.2f} | "
            f"{tiered['cached'] / plain['cached']:.2f} | {plain['decode'] * 1e6:.2f} | "
            f"{tiered['decode'] * 1e6:.2f} | {tiered['decode'] / plain['decode']:.2f} |"
        )


if __name__ == "__main__":
    main()
