"""Manager benchmark: admission of a long prompt (cold and fully cached) against the pure hashing
time of the same tokens, and a decode step, per backend, measured side by side in one run; then
the same on a hybrid model (full attention, a 4,096-token window and an SSM layer, with
``commit_min_snapshot``: each commit snapshots the state).

Admission is ``create_kv_cache`` + ``resume`` + ``resize`` to the prompt length, as an engine
admits a request; a decode step is ``resize`` by one token and ``commit`` of one token.

Then the iteration cost for 256 running requests (issue 14): every request resized by one token
and given one token, as one ``resize_many`` + one ``commit_many`` against one ``resize`` and one
``commit`` per cache, per backend. The engine keeps its own capacities (no per-cache reads).

Last, prefill churn (what a replay's admissions cost, issue 14): distinct prompts admitted one
after another through a pool that holds two of them, so every ``resize`` to the prompt evicts
the previous prompts' blocks and every prefill ``commit`` puts a prompt's blocks into the tree;
per block, against the block keys of the same prompts (their hashing alone).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
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
    RemoteCacheTierConfig,
    SsmLayerConfig,
)


def config(
    tokens: int,
    tokens_per_block: int,
    tiers_in: str | None = None,
    hybrid: bool = False,
    remote: kv_api.BlockStore | None = None,
) -> KVCacheManagerConfig:
    """Room for two prompts with headroom; with ``tiers_in``, a host and a disk tier (in that
    directory) of the device's size below it; with ``remote``, a remote tier on that store last.
    ``hybrid``: one full-attention, one window and one SSM layer instead of two full-attention
    layers."""
    kv = [BufferConfig("key", 512), BufferConfig("value", 512)]
    quota = 4 * (tokens // tokens_per_block + 16) * 2 * 1024
    tiers: list[CacheTierConfig] = [GpuCacheTierConfig(quota)]
    if tiers_in is not None:
        tiers += [HostCacheTierConfig(quota), DiskCacheTierConfig(quota, tiers_in)]
    if remote is not None:
        tiers.append(RemoteCacheTierConfig(remote, "bench"))
    if hybrid:
        layers: list[AttentionLayerConfig | SsmLayerConfig] = [
            AttentionLayerConfig(0, kv),
            AttentionLayerConfig(1, kv, sliding_window_size=4096),
            SsmLayerConfig(2, [BufferConfig("state", 4096)]),
        ]
        return KVCacheManagerConfig(tokens_per_block, tiers, layers, commit_min_snapshot=True)
    return KVCacheManagerConfig(
        tokens_per_block=tokens_per_block,
        cache_tiers=tiers,
        layers=[AttentionLayerConfig(0, kv), AttentionLayerConfig(1, kv)],
    )


def settle(remote: kv_api.BlockStore | None) -> None:
    """Wait for a store's writes queued so far (a prompt's blocks written through): a decode step
    is timed on its own writes, not on the tail of an earlier commit's."""
    flush = getattr(remote, "flush", None)
    if flush is not None:
        flush(60)


def best_of(fn: Callable[[], float], repeat: int) -> float:
    return min(fn() for _ in range(repeat))


def admit(manager: Any, tokens: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    cache = manager.create_kv_cache(None, tokens)
    assert cache.resume()
    assert cache.resize(len(tokens))
    return time.perf_counter() - start, cache


def measure(
    backend: kv_api.Backend,
    tokens: np.ndarray[Any, Any],
    tokens_per_block: int,
    repeat: int,
    steps: int,
    tiers_in: str | None = None,
    hybrid: bool = False,
    remote: kv_api.BlockStore | None = None,
) -> dict[str, float]:
    out: dict[str, float] = {}
    out["hash"] = best_of(lambda: timed(lambda: backend.block_keys(tokens_per_block, None, tokens)), repeat)

    def cold() -> float:
        manager = backend.KVCacheManager(config(len(tokens), tokens_per_block, tiers_in, hybrid, remote))
        seconds, cache = admit(manager, tokens)
        cache.close()
        return seconds

    out["cold"] = best_of(cold, repeat)
    manager = backend.KVCacheManager(config(len(tokens), tokens_per_block, tiers_in, hybrid, remote))
    _, first = admit(manager, tokens)
    first.commit(tokens)
    first.close()

    def cached() -> float:
        seconds, cache = admit(manager, tokens)
        assert cache.num_committed_tokens == len(tokens)
        cache.close()
        return seconds

    out["cached"] = best_of(cached, repeat)
    _, cache = admit(manager, tokens[: len(tokens) // 2])
    next_token = 1
    settle(remote)

    def decode() -> float:
        nonlocal next_token
        start = time.perf_counter()
        for _ in range(steps):
            cache.resize(cache.capacity + 1)
            cache.commit([next_token])
            next_token += 1
        return (time.perf_counter() - start) / steps

    out["decode"] = best_of(decode, repeat)
    cache.close()
    return out


def iteration(
    backend: kv_api.Backend,
    running: int,
    tokens_per_block: int,
    repeat: int,
    steps: int,
    remote: kv_api.BlockStore | None = None,
) -> dict[str, float]:
    """Seconds per iteration of ``running`` requests, batched and one call per cache (with
    ``remote``, a remote tier on that store attached)."""
    prompt = 64
    manager = backend.KVCacheManager(
        config(running * (prompt + 2 * repeat * steps + 2 * tokens_per_block), tokens_per_block, remote=remote)
    )
    rng = np.random.default_rng(1)
    caches = manager.admit_many(
        [None] * running, [rng.integers(0, 2**31, prompt, dtype=np.int32) for _ in range(running)]
    )
    capacities = [prompt] * running
    for c in caches:
        assert c.resume() and c.resize(prompt)
    ones = [1] * running
    next_token = 1

    def batched() -> float:
        nonlocal next_token
        start = time.perf_counter()
        for _ in range(steps):
            for i in range(running):
                capacities[i] += 1
            assert all(manager.resize_many(caches, capacities))
            manager.commit_many(caches, np.arange(next_token, next_token + running, dtype=np.int32), ones)
            next_token += running
        return (time.perf_counter() - start) / steps

    def single() -> float:
        nonlocal next_token
        start = time.perf_counter()
        for _ in range(steps):
            for i, c in enumerate(caches):
                capacities[i] += 1
                assert c.resize(capacities[i])
                c.commit([next_token])
                next_token += 1
        return (time.perf_counter() - start) / steps

    out = {"batched": best_of(batched, repeat), "single": best_of(single, repeat)}
    for c in caches:
        c.close()
    return out


def churn(backend: kv_api.Backend, tokens_per_block: int, prompts: int, length: int, rounds: int) -> dict[str, float]:
    """Seconds per block: the evicting resize, the prefill commit, and the prompts' hashing."""
    rng = np.random.default_rng(2)
    inputs = [rng.integers(0, 2**31, length, dtype=np.int32) for _ in range(prompts)]
    manager = backend.KVCacheManager(config(length, tokens_per_block))
    resize = commit = 0.0
    for _ in range(rounds):
        for prompt in inputs:
            cache = manager.create_kv_cache(None, prompt)
            assert cache.resume()
            start = time.perf_counter()
            assert cache.resize(len(prompt))
            sized = time.perf_counter()
            cache.commit(prompt[cache.num_committed_tokens :])
            done = time.perf_counter()
            resize += sized - start
            commit += done - sized
            cache.close()
    blocks = rounds * prompts * (length // tokens_per_block)
    hashing = min(timed(lambda: [backend.block_keys(tokens_per_block, None, p) for p in inputs]) for _ in range(rounds))
    return {
        "resize": resize / blocks,
        "commit": commit / blocks,
        "hash": hashing / (prompts * (length // tokens_per_block)),
    }


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=200_000)
    parser.add_argument("--tokens-per-block", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--running", type=int, default=256, help="requests in an iteration (batched calls)")
    parser.add_argument("--iterations", type=int, default=50, help="iterations per batched-call measurement")
    parser.add_argument("--only-batched", action="store_true", help="measure the batched calls only")
    parser.add_argument("--churn-prompts", type=int, default=40, help="distinct prompts in the prefill churn")
    parser.add_argument("--churn-tokens", type=int, default=12_000, help="tokens per prompt in the prefill churn")
    parser.add_argument("--churn-rounds", type=int, default=3, help="times the prompts are admitted in turn")
    args = parser.parse_args()
    tokens = np.random.default_rng(0).integers(0, 2**31, args.tokens, dtype=np.int32)
    plain_results: dict[str, dict[str, float]] = {}
    for hybrid in () if args.only_batched else (False, True):
        results = {
            name: measure(
                kv_api.load_backend(name), tokens, args.tokens_per_block, args.repeat, args.steps, None, hybrid
            )
            for name in kv_api.available_backends()
        }
        layers = "full attention + window + SSM, commit_min_snapshot" if hybrid else "2 layers in one layer group"
        print(f"{args.tokens}-token prompt as an int32 buffer, {args.tokens_per_block} tokens per block, {layers}\n")
        report(results)
        if hybrid:
            for name, r in results.items():
                plain = plain_results[name]
                print(
                    f"{name}: hybrid vs attention only: cold admission {r['cold'] / plain['cold']:.2f}x, "
                    f"cached {r['cached'] / plain['cached']:.2f}x, decode step {r['decode'] / plain['decode']:.2f}x"
                )
        plain_results = results
        print()
    print(
        f"Iteration of {args.running} running requests (resize by one + commit of one, all of them), "
        f"{args.tokens_per_block} tokens per block\n"
    )
    print("| backend | one call per cache (us) | batched (us) | batched speed-up |")
    print("|---|---|---|---|")
    for name in kv_api.available_backends():
        r = iteration(kv_api.load_backend(name), args.running, args.tokens_per_block, args.repeat, args.iterations)
        print(f"| {name} | {r['single'] * 1e6:.0f} | {r['batched'] * 1e6:.0f} | {r['single'] / r['batched']:.2f}x |")
    if args.only_batched:
        return
    print(
        f"\nPrefill churn: {args.churn_prompts} prompts of {args.churn_tokens} tokens admitted in turn, "
        f"{args.churn_rounds} rounds, through a pool of two prompts' blocks ({args.tokens_per_block} tokens per block)\n"
    )
    print(
        "| backend | evicting resize (ns/block) | prefill commit (ns/block) | hashing (ns/block) | commit x hashing |"
    )
    print("|---|---|---|---|---|")
    for name in kv_api.available_backends():
        r = churn(
            kv_api.load_backend(name), args.tokens_per_block, args.churn_prompts, args.churn_tokens, args.churn_rounds
        )
        print(
            f"| {name} | {r['resize'] * 1e9:.0f} | {r['commit'] * 1e9:.0f} | {r['hash'] * 1e9:.0f} | "
            f"{r['commit'] / r['hash']:.2f} |"
        )


def report(results: dict[str, dict[str, float]]) -> None:
    print(
        "| backend | hashing (ms) | cold admission (ms) | x hashing | cached admission (ms) | x hashing | decode step (us) |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, r in results.items():
        print(
            f"| {name} | {r['hash'] * 1e3:.2f} | {r['cold'] * 1e3:.2f} | {r['cold'] / r['hash']:.2f} | "
            f"{r['cached'] * 1e3:.2f} | {r['cached'] / r['hash']:.2f} | {r['decode'] * 1e6:.1f} |"
        )
    if "cpp" in results and "py" in results:
        cpp, py = results["cpp"], results["py"]
        print(
            f"\ncpp vs py: cold admission {py['cold'] / cpp['cold']:.1f}x, cached admission "
            f"{py['cached'] / cpp['cached']:.1f}x, decode step {py['decode'] / cpp['decode']:.1f}x faster"
        )


if __name__ == "__main__":
    main()
