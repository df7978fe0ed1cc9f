"""kvcore against vLLM's own v1 KVCacheManager, one engine loop driving both (issue 27, item 3).

Run by ``nox -s bench_peers`` (not in CI: it installs vLLM). Both managers replay the same
requests through ``kv_replay.replayer.Replayer`` (``vllm_manager.py`` maps the loop's calls onto
vLLM's), with the same pool (``--blocks`` usable blocks of ``--tokens-per-block``), the same
``--in-flight`` limit, admission order and preemption rule. Reported, kvcore native first:

- hit rate: reused / prompt tokens of each request when it first starts;
- manager time: the loop's time inside manager and cache calls (vLLM's less the harness's
  numpy-to-list conversion of each prompt), and per engine step;
- the replay's wall time, the loop's own Python included, and per step;
- per-block hashing outside the loop: kvcore's ``block_keys`` against vLLM's request block
  hasher (``--hash``: its default ``sha256``, pickle then SHA-256, or ``sha256_cbor``) on the
  same 4,096-token prompts.

Rounds alternate which side goes first; each figure is the best of ``--repeat``. Caveats that the
numbers carry are printed under them.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from collections.abc import Callable

import numpy as np
from bench_command import conversation
from bench_keys import best_of
from bench_replay_vs_mocker import BYTES_PER_TOKEN, LAYERS, trace_prefix
from vllm_manager import HASHES, VllmPeer

import kv_api
from kv_api.errors import BackendError
from kv_replay.model import model_config
from kv_replay.replay_result import ReplayResult
from kv_replay.replayer import Replayer
from kv_replay.report import summary
from kv_replay.trace import Request, load_trace

CAVEATS = """\
  caveats:
  - the same rules where the two differ by default: kvcore reuses whole blocks only here (by
    default it also reuses a partial block's tokens) and admits up to a full pool (by default
    it refuses a resume above 97% in use; vLLM's manager has no watermark unless given one);
  - a waiting request holds its matched prefix in kvcore (create_kv_cache returns a suspended
    cache holding those pages, which running requests then cannot evict), while vLLM's lookup
    holds nothing until allocate_slots succeeds: under pressure kvcore preempts a running
    request where vLLM evicts the waiting one's prefix, so preemptions, steps and hit rates can
    part slightly (the table's last column);
  - vLLM never reuses a prompt's last token (it must compute its logits): a prompt cached to its
    last block boundary hits one block less there than kvcore's does;
  - kvcore keeps its statistics (hit counts, per-level usage) in every call; vLLM's are off
    (``log_stats=False``), and neither side publishes events;
  - vLLM's manager time includes this harness's mapping layer (a few attribute reads and one
    Python call per loop call, vllm_manager.py); kvcore native's includes the crossing into C++;
  - vLLM hashes a prompt when its request is built (here, in create_kv_cache) and a decoded block
    when the token that fills it is appended (in commit); kvcore in create_kv_cache and commit;
  - kvcore's decode step is one resize_many and one commit_many (its batched calls); vLLM has
    none: its scheduler calls allocate_slots per request. The "1by1" row drives kvcore that way."""


def replay(make: Callable[[], Replayer], requests: list[Request]) -> tuple[ReplayResult, float]:
    """One replay's result and the manager seconds to report (vLLM's less the harness's)."""
    replayer = make()
    result = replayer.run(requests)
    harness = getattr(replayer.manager, "harness_seconds", 0.0)
    replayer.manager.shutdown()
    return result, result.manager_seconds - harness


def hashing(backend: kv_api.Backend, peer: VllmPeer, args: argparse.Namespace) -> tuple[float, float]:
    """ns per block: kvcore's block keys and vLLM's block hasher over the same 4,096-token prompts."""
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 1 << 20, 4096, dtype=np.int32) for _ in range(64)]
    lists = [p.tolist() for p in prompts]
    blocks = sum(len(p) // args.tokens_per_block for p in prompts)
    hasher = peer.hasher(args.tokens_per_block)
    v = peer.vllm
    sampling = v.sampling.SamplingParams(max_tokens=1)
    # vLLM's own requests, built without a hasher: the hasher returns every full block's hash
    # (it reads ``block_hashes`` to start after them, and they stay empty).
    requests = [v.request.Request(str(i), ids, sampling, None) for i, ids in enumerate(lists)]
    ours = best_of(lambda: [backend.block_keys(args.tokens_per_block, None, t) for t in prompts], args.repeat)
    theirs = best_of(lambda: [hasher(request) for request in requests], args.repeat)
    return ours / blocks * 1e9, theirs / blocks * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", choices=("mooncake", "conversation"), default="mooncake")
    parser.add_argument("--limit", type=int, default=1000, help="requests: the trace's first N")
    parser.add_argument("--tokens-per-block", type=int, default=32)
    parser.add_argument("--blocks", type=int, default=8192, help="usable device blocks, both sides")
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--hash", choices=HASHES, default="sha256", help="vLLM's block hash")
    parser.add_argument("--backend", default="cpp", help="kvcore's backend")
    args = parser.parse_args()
    if min(args.limit, args.tokens_per_block, args.blocks, args.in_flight, args.repeat) < 1:
        parser.error("--limit, --tokens-per-block, --blocks, --in-flight and --repeat must be >= 1")
    try:
        backend = kv_api.load_backend(args.backend)
    except BackendError as exc:
        parser.error(f"--backend: {exc}")
    try:
        peer = VllmPeer(args.blocks, args.hash)
    except ImportError as exc:
        raise SystemExit(f"vLLM is not installed ({exc}): run nox -s bench_peers") from None
    # vLLM's rules on kvcore's side: whole blocks only (no partial-block reuse) and no admission
    # watermark (vLLM's manager defaults to none; kvcore's refuses a resume above 97% in use).
    config = dataclasses.replace(
        model_config(
            LAYERS,
            args.tokens_per_block,
            args.blocks * 2 * BYTES_PER_TOKEN * args.tokens_per_block,
            BYTES_PER_TOKEN,
            partial_reuse=False,
        ),
        max_util_for_resume=1.0,
    )
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp:
        path = trace_prefix(args.limit, tmp) if args.trace == "mooncake" else conversation(tmp, 200)
        requests = load_trace(path, args.limit)

    def per_cache() -> Replayer:  # kvcore driven as vLLM is: one call per cache in the decode step
        replayer = Replayer(backend, config, args.in_flight)
        replayer.batched = False
        return replayer

    sides: dict[str, Callable[[], Replayer]] = {
        f"kvcore {backend.name}": lambda: Replayer(backend, config, args.in_flight),
        f"kvcore {backend.name} 1by1": per_cache,
        f"vLLM {args.hash}": lambda: Replayer(peer, config, args.in_flight),  # type: ignore[arg-type]
    }
    probe = kv_api.create_manager(config, backend=backend)
    slots = probe.get_storage_statistics()[0].total
    probe.shutdown()
    if slots != args.blocks:
        raise SystemExit(f"kvcore's manager got {slots} slots, not --blocks {args.blocks}")
    print(
        f"kvcore vs vLLM's v1 KVCacheManager: {args.trace}, {len(requests):,} requests, {args.blocks:,} blocks of"
        f" {args.tokens_per_block} tokens, {args.in_flight} in flight; best of {args.repeat}, sides alternating"
    )
    best: dict[str, tuple[float, float, ReplayResult]] = {
        name: (float("inf"), 0.0, ReplayResult("", 0, 0, [])) for name in sides
    }
    for round_ in range(args.repeat):
        order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
        for name in order:
            result, manager = replay(sides[name], requests)
            if manager < best[name][0]:
                best[name] = (manager, result.wall_seconds, result)
    report(best, hashing(backend, peer, args))


def report(best: dict[str, tuple[float, float, ReplayResult]], hashes: tuple[float, float]) -> None:
    """A row per side, then vLLM's figures as ratios to kvcore's (batched) and the hashing."""
    names = list(best)
    ours_name, theirs_name = names[0], names[-1]
    ours, ours_wall, ours_result = best[ours_name]
    theirs, theirs_wall, theirs_result = best[theirs_name]
    print(
        f"  {'':<20} {'hit rate':>9} {'manager ms':>11} {'µs/step':>8} {'replay ms':>10} {'µs/step':>8} {'steps':>8} {'preempted':>9}"
    )
    hit = {name: float(summary(result)["hit_rate"]) for name, (_, _, result) in best.items()}
    for name, (manager, wall, result) in best.items():
        steps = max(result.steps, 1)
        print(
            f"  {name:<20} {hit[name]:>9.4%} {manager * 1e3:>11.1f} {manager / steps * 1e6:>8.2f}"
            f" {wall * 1e3:>10.1f} {wall / steps * 1e6:>8.2f} {result.steps:>8,} {sum(r.preemptions for r in result.records):>9,}"
        )
    ours_steps, theirs_steps = max(ours_result.steps, 1), max(theirs_result.steps, 1)
    ours_hit, theirs_hit = hit[ours_name], hit[theirs_name]
    print(f"  hit rates {'identical' if ours_hit == theirs_hit else f'differ by {theirs_hit - ours_hit:+.4%}'}")
    one_by_one = best[names[1]][0]
    print(f"  {names[1]} / {ours_name} (batched decode step): manager time {one_by_one / ours:.2f}x")
    print(
        f"  {theirs_name} / {ours_name}: manager time {theirs / ours:.2f}x, per step"
        f" {(theirs / theirs_steps) / (ours / ours_steps):.2f}x, the replay {theirs_wall / ours_wall:.2f}x"
    )
    print(
        f"  hashing per block: {ours_name} {hashes[0]:.0f} ns, {theirs_name} {hashes[1]:.0f} ns ({hashes[1] / hashes[0]:.1f}x)"
    )
    print(CAVEATS)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)
