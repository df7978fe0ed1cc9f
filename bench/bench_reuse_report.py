"""What the reuse report costs (issue 28, docs/manager.md "Why a prompt missed"): admission
(``create_kv_cache`` + ``resume`` + ``resize`` to the prompt) with ``reuse_report`` on against
off, per backend, side by side in one run, for three prompts:

- cached: every block in the tree (the report adds the tail's arithmetic only);
- cold: never seen, with a ghost record full of other keys (one lookup, one extra hash);
- evicted: every block evicted earlier, so the ghost record knows each (one extra hash and one
  lookup per block: the report's worst case);
- evicted + prefill: the same admission and then the prefill commit of the whole prompt, which
  takes the keys the report hashed rather than hash the blocks again (the prompt is evicted
  again, by fresh prompts, before the next try);

and the same with ``reuse_report_other_scope`` (a second hash of each missed block). Each pair is
measured alternately on two managers built the same way, one admission each in turn: the best of
``--repeat`` admissions per 200,000 prompt tokens (100 times that for a 2,000-token prompt), so a
short admission gets enough tries to find its quiet time on a shared machine.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

import kv_api
from kv_api import AttentionLayerConfig, BufferConfig, GpuCacheTierConfig, KVCacheManagerConfig


def config(tokens: int, tokens_per_block: int, **report: Any) -> KVCacheManagerConfig:
    """Room for a few prompts (the device quota rounds up to 2 MiB grains)."""
    kv = [BufferConfig("key", 512), BufferConfig("value", 512)]
    quota = 3 * (tokens // tokens_per_block + 2) * 2 * 1024
    layers = [AttentionLayerConfig(0, kv), AttentionLayerConfig(1, kv)]
    return KVCacheManagerConfig(tokens_per_block, [GpuCacheTierConfig(quota)], layers, **report)


def commit(manager: Any, tokens: Any) -> None:
    cache = manager.create_kv_cache(None, tokens)
    assert cache.resume() and cache.resize(len(tokens))
    cache.commit(tokens[cache.num_committed_tokens :])
    cache.close()


def admission(manager: Any, tokens: Any) -> float:
    start = time.perf_counter()
    cache = manager.create_kv_cache(None, tokens)
    assert cache.resume() and cache.resize(len(tokens))
    seconds = time.perf_counter() - start
    cache.close()  # nothing committed: the tree and the ghost record stay as they were
    return seconds


def prefill(manager: Any, tokens: Any) -> float:
    start = time.perf_counter()
    cache = manager.create_kv_cache(None, tokens)
    assert cache.resume() and cache.resize(len(tokens))
    cache.commit(tokens[cache.num_committed_tokens :])
    seconds = time.perf_counter() - start
    cache.close()
    return seconds


def evict(manager: Any, prompt: Any, rng: np.random.Generator) -> None:
    """Commit fresh prompts until ``prompt`` is evicted again."""
    while manager.probe_reuse(None, prompt):
        commit(manager, rng.integers(0, 2**31, len(prompt), dtype=np.int32))


def prepared(backend: kv_api.Backend, prompts: list[Any], tokens_per_block: int, **report: Any) -> Any:
    """A manager where ``prompts[0]`` was evicted (by ``prompts[2:]``, as many as that takes)
    and ``prompts[1]`` is cached."""
    manager = backend.KVCacheManager(config(len(prompts[0]), tokens_per_block, **report))
    commit(manager, prompts[0])
    for p in prompts[2:]:
        if not manager.probe_reuse(None, prompts[0]):
            break
        commit(manager, p)
    assert not manager.probe_reuse(None, prompts[0])
    commit(manager, prompts[1])
    return manager


def measure(backend: kv_api.Backend, tokens: int, tokens_per_block: int, repeat: int, **on: Any) -> dict[str, float]:
    """Admission time with the report as ``on`` over the time with it off, per prompt."""
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 2**31, tokens, dtype=np.int32) for _ in range(40)]
    managers = [prepared(backend, prompts, tokens_per_block, reuse_report=False)]
    managers.append(prepared(backend, prompts, tokens_per_block, **on))
    probe = managers[1].create_kv_cache(None, prompts[0])
    assert probe.reuse_report is not None
    assert probe.reuse_report.miss_evicted_tokens == tokens // tokens_per_block * tokens_per_block
    probe.close()
    out = {}
    for name, prompt in (("cached", prompts[1]), ("cold", prompts[-1]), ("evicted", prompts[0])):
        best = [float("inf"), float("inf")]
        for _ in range(repeat * max(1, 200_000 // tokens)):
            for i, m in enumerate(managers):
                best[i] = min(best[i], admission(m, prompt))
        out[name] = best[1] / best[0]
        out[f"{name}_off"] = best[0]
    best = [float("inf"), float("inf")]
    for n in range(max(3, repeat // 4)):
        for i, m in enumerate(managers):
            best[i] = min(best[i], prefill(m, prompts[0]))
            evict(m, prompts[0], np.random.default_rng(n + 1))
    out["prefill"] = best[1] / best[0]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens-per-block", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    print(
        f"Admission with the reuse report on / off, {args.tokens_per_block} tokens per block, best of {args.repeat}\n"
    )
    print("| backend | prompt | report | cached | cold | evicted | evicted + prefill | cold admission off (ms) |")
    print("|---|---|---|---|---|---|---|---|")
    for name in kv_api.available_backends():
        backend = kv_api.load_backend(name)
        for tokens in (2_000, 200_000):
            for label, on in (("on", {}), ("+ other scopes", {"reuse_report_other_scope": True})):
                r = measure(backend, tokens, args.tokens_per_block, args.repeat, **on)
                print(
                    f"| {name} | {tokens:,} | {label} | {r['cached']:.3f}x | {r['cold']:.3f}x | "
                    f"{r['evicted']:.3f}x | {r['prefill']:.3f}x | {r['cold_off'] * 1e3:.3f} |"
                )


if __name__ == "__main__":
    main()
