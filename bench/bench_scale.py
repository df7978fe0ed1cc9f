"""Cost as the cache grows (issue 27): admission, a decode step and eviction with 10^4, 10^6 and
10^7 blocks in the tree, and the bookkeeping bytes per cached block, per backend, side by side.

Each (backend, size, tiers) point runs in a fresh process (so its resident-memory growth is its
own). The levels get quotas for ``size`` blocks plus two prompts of room; the manager rounds each
up to its grain, and the tree is filled with distinct 4,096-token prompts (256 blocks of 16
tokens each: admitted, committed, closed, so their pages stay cached and evictable) to two
prompts short of the slots it got, the count the table shows. Then, each the median of
``--samples`` over prompts drawn at random (so a walk meets memory as a long-running engine's
would, not what the last call left in cache):

- *cached LEVEL*: ``create_kv_cache`` + ``resume`` + ``resize`` of a prompt whose blocks are all
  cached, most of them in LEVEL (from the host or the disk: brought up to the device, which
  sends as many of its pages down);
- *cold*: the same for a prompt never seen, with room free somewhere (nothing dropped);
- *evicting*: a new prompt's admission when every level is full, so its ``resize`` evicts 256
  of the least recently used blocks (each such prompt is committed, so the next one evicts too);
- *commit*: the prefill ``commit`` of such a prompt (its 256 keys hashed, its blocks inserted);
- *decode*: ``resize`` by one token and ``commit`` of one token on a cached prompt's cache;
  then the same steps timed one by one and split: *in a block* (a step that neither needs a new
  page nor fills a block) and *new block* (one that does: its resize takes a page, evicting the
  least recently used block, or its commit puts a full block into the tree);
- *fill*: the filling's time per block (admit, commit, close: a replay's cost per block);
- *bytes/block*: resident memory grown by the filling, less the memory pools' bytes, per block.

``--tiers``: the device gets 1% of the blocks (at least its one grain, which holds the whole
smallest tree), a host tier half the rest and a disk tier (in a temporary directory) the other
half. Pages are 192 bytes (one layer, one buffer): the figures are the manager's bookkeeping and
small copies, not bulk data movement (bench_tiers.py measures that). The ratios are each size's
figure over the smallest size's that has it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

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

TOKENS_PER_BLOCK = 16
PROMPT = 4096
BLOCKS_PER_PROMPT = PROMPT // TOKENS_PER_BLOCK
# 192-byte pages: the smallest device level (one 2 MiB grain, docs/manager.md "Sizing") then
# holds 10,922 slots, about the smallest size's blocks plus two prompts of room.
SLOT_BYTES = 192
LEVEL_NAMES = ("device", "host", "disk")
FIGURES = ("cold", "evicting", "commit", "decode", "decode, in a block", "decode, new block", "fill")


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def prompt(i: int) -> np.ndarray[Any, Any]:
    """The i-th distinct prompt, made again from its seed rather than kept (its bytes would count
    as the manager's)."""
    return np.random.default_rng(i).integers(0, 2**31, PROMPT, dtype=np.int64)


def tiers_for(blocks: int, tiers: bool, disk_dir: str) -> list[CacheTierConfig]:
    """Quotas for ``blocks`` cached blocks plus two prompts of room (the manager rounds each up
    to its grain; ``point`` fills what it actually got)."""
    total = blocks + 2 * BLOCKS_PER_PROMPT
    if not tiers:
        return [GpuCacheTierConfig(total * SLOT_BYTES)]
    device = max(blocks // 100, 2 * BLOCKS_PER_PROMPT)
    host = (total - device) // 2
    return [
        GpuCacheTierConfig(device * SLOT_BYTES),
        HostCacheTierConfig(host * SLOT_BYTES),
        DiskCacheTierConfig((total - device - host) * SLOT_BYTES, disk_dir),
    ]


def median(values: list[float]) -> float:
    return float(np.median(values)) if values else float("nan")


def admit(manager: Any, tokens: np.ndarray[Any, Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    cache = manager.create_kv_cache(None, tokens)
    assert cache.resume()
    assert cache.resize(PROMPT)
    return time.perf_counter() - start, cache


def point(backend_name: str, blocks: int, tiers: bool, samples: int) -> dict[str, float]:
    """One size's figures (seconds, bytes) in this process: the levels filled to two prompts
    short of the slots they have."""
    backend = kv_api.load_backend(backend_name)
    with tempfile.TemporaryDirectory(prefix="kvcore-bench-scale-") as disk_dir:
        levels = tiers_for(blocks, tiers, disk_dir)
        layers = [AttentionLayerConfig(0, [BufferConfig("kv", SLOT_BYTES)])]
        manager = backend.KVCacheManager(KVCacheManagerConfig(TOKENS_PER_BLOCK, levels, layers))
        slots = [manager.get_storage_statistics(level)[0].total for level in range(len(levels))]
        prompts = sum(slots) // BLOCKS_PER_PROMPT - 2
        pool_bytes = sum(slots[:2]) * SLOT_BYTES  # the disk level's bytes are a file's
        before = resident_bytes()
        start = time.perf_counter()
        for i in range(prompts):
            tokens = prompt(i)
            _, cache = admit(manager, tokens)
            cache.commit(tokens)
            cache.close()
        cached_blocks = prompts * BLOCKS_PER_PROMPT
        out = {"blocks": float(cached_blocks), "fill": (time.perf_counter() - start) / cached_blocks}
        out["bytes"] = (resident_bytes() - before - pool_bytes) / cached_blocks
        out.update(cached_by_level(manager, prompts, [s // BLOCKS_PER_PROMPT for s in slots], samples))
        out.update(timings(manager, prompts, samples))
        manager.shutdown()
    return out


def cached_by_level(manager: Any, prompts: int, level_prompts: list[int], samples: int) -> dict[str, float]:
    """Cached admission per level the prompt's pages come from: prompts are drawn from where
    the filling left each level's (the newest on the device, older ones below), then counted
    under the level that served most of their tokens (a draw moves pages, so others shift)."""
    rng = np.random.default_rng(0)
    times: dict[int, list[float]] = {level: [] for level in range(len(level_prompts))}
    end = prompts
    for level, count in enumerate(level_prompts):
        first = max(end - count, 0)
        for _ in range(2 * samples if first < end else 0):
            seconds, cache = admit(manager, prompt(int(rng.integers(first, end))))
            assert cache.num_committed_tokens == PROMPT
            by_level = cache.cached_tokens_by_level
            times[by_level.index(max(by_level))].append(seconds)
            cache.close()
            if len(times[level]) >= samples:
                break
        end = first
    return {f"cached {LEVEL_NAMES[level]}": median(values) for level, values in times.items()}


def timings(manager: Any, prompts: int, samples: int) -> dict[str, float]:
    rng = np.random.default_rng(1)
    fresh = iter(range(prompts, prompts + 4 * samples))

    def cold() -> float:
        seconds, cache = admit(manager, prompt(next(fresh)))
        cache.close()
        return seconds

    commits: list[float] = []

    def evicting() -> float:
        tokens = prompt(next(fresh))
        seconds, cache = admit(manager, tokens)
        start = time.perf_counter()
        cache.commit(tokens)
        commits.append(time.perf_counter() - start)
        cache.close()
        return seconds

    def decode() -> float:
        _, cache = admit(manager, prompt(int(rng.integers(prompts))))
        steps = 32
        start = time.perf_counter()
        for step in range(steps):
            assert cache.resize(PROMPT + 1 + step)
            cache.commit([step])
        seconds = (time.perf_counter() - start) / steps
        cache.close()
        return seconds

    def decode_split() -> tuple[list[float], list[float]]:
        _, cache = admit(manager, prompt(int(rng.integers(prompts))))
        inside: list[float] = []
        boundary: list[float] = []
        for step in range(32):
            start = time.perf_counter()
            assert cache.resize(PROMPT + 1 + step)
            cache.commit([step])
            at_edge = step % TOKENS_PER_BLOCK in (0, TOKENS_PER_BLOCK - 1)  # a new page, a full block
            (boundary if at_edge else inside).append(time.perf_counter() - start)
        cache.close()
        return inside, boundary

    out = {"cold": median([cold() for _ in range(samples)])}
    evicting()  # takes the two prompts' free room: every later admission evicts
    evicting()
    commits.clear()
    out["evicting"] = median([evicting() for _ in range(samples)])
    out["commit"] = median(commits)
    out["decode"] = median([decode() for _ in range(samples)])
    split = [decode_split() for _ in range(samples)]
    out["decode, in a block"] = median([t for inside, _ in split for t in inside])
    out["decode, new block"] = median([t for _, boundary in split for t in boundary])
    return out


def run_point(backend: str, blocks: int, tiers: bool, samples: int) -> dict[str, float]:
    """``point`` in a fresh process."""
    args = [sys.executable, __file__, "--point", backend, str(blocks), "--samples", str(samples)]
    done = subprocess.run([*args, *(["--tiers"] if tiers else [])], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"bench_scale.py: the {backend} point with {blocks:,} blocks failed:\n{done.stderr}")
    result: dict[str, float] = json.loads(done.stdout)
    return result


def table(backend: str, tiers: bool, points: list[dict[str, float]]) -> None:
    """Each figure in microseconds and over the smallest size's (the smallest that reached its
    level, for a cached admission from the host or the disk)."""
    figures = [f"cached {name}" for name in LEVEL_NAMES[: 3 if tiers else 1]] + list(FIGURES)
    print(f"\n{backend}, {'device 1% + host + disk' if tiers else 'device only'}")
    print("| blocks cached | " + " | ".join(f"{f} (us) | x" for f in figures) + " | bytes/block |")
    print("|---" * (2 * len(figures) + 2) + "|")
    for p in points:
        cells = []
        for f in figures:
            first = next((q[f] for q in points if q[f] == q[f]), float("nan"))  # the first not NaN
            cells.append("- | -" if p[f] != p[f] else f"{p[f] * 1e6:.2f} | {p[f] / first:.2f}")
        print(f"| {p['blocks']:,.0f} | " + " | ".join(cells) + f" | {p['bytes']:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,1000000,10000000", help="blocks in the tree, comma-separated")
    parser.add_argument("--python-max", type=int, default=1_000_000, help="largest size run on the Python backend")
    parser.add_argument("--samples", type=int, default=41, help="samples per figure (the median is shown)")
    parser.add_argument("--tiers", action="store_true", help="also with a host and a disk tier below a small device")
    parser.add_argument("--point", nargs=2, metavar=("BACKEND", "BLOCKS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.point is not None:
        print(json.dumps(point(args.point[0], int(args.point[1]), args.tiers, args.samples)))
        return
    try:
        sizes = [int(float(s)) for s in args.sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes: expected comma-separated block counts, got {args.sizes!r}")
    if args.samples < 1:
        parser.error("--samples: must be at least 1")
    if any(s < BLOCKS_PER_PROMPT for s in sizes):
        parser.error(f"--sizes: each size must be at least {BLOCKS_PER_PROMPT} blocks (one prompt)")
    for tiers in (False, True) if args.tiers else (False,):
        for backend in kv_api.available_backends():
            chosen = [s for s in sizes if backend != "py" or s <= args.python_max]
            if chosen:
                table(backend, tiers, [run_point(backend, s, tiers, args.samples) for s in chosen])


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)
