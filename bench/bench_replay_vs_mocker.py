"""Replay against NVIDIA Dynamo's mocker (issue 14): the first ``--limit`` requests of the Mooncake
synthetic trace, with the same capacity (``--tokens-per-block`` 32, ``--blocks`` 8,192, ``--in-flight``
16), through ``kvcore replay``'s ``Replayer`` and through ``dynamo._core.run_mocker_trace_replay``
(PyPI ``ai-dynamo-runtime``; the row is reported and skipped where it is not installed).

Both read the same file (the prefix, written to a temporary file). The hit rates compared are
reused / prompt tokens of each request when it first starts: the replay's ``hit_rate`` and the
mocker's ``first_admission_prefix_cache_reused_ratio`` (its ``prefix_cache_reused_ratio`` also
counts re-admissions after preemption). Times are wall clock, best of ``--repeat``: kvcore's is
``Replayer.run`` (building the manager and the replay; the trace's tokens are generated before,
as the replay command does, and that time is printed on its own), the mocker's is the whole call
(it reads the file and hashes its blocks inside).
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import importlib
import itertools
import os
import tempfile
import time
from importlib import resources
from typing import Any

import kv_api
from kv_replay.model import model_config
from kv_replay.replayer import Replayer
from kv_replay.report import summary
from kv_replay.trace import BUILTIN_TRACES, MOONCAKE_BLOCK, load_trace

LAYERS = "1"
BYTES_PER_TOKEN = 4  # a block of 32 tokens is 2 * 4 * 32 = 256 bytes: 8,192 blocks in 2 MiB


def trace_prefix(limit: int, directory: str) -> str:
    """The first ``limit`` lines of the built-in Mooncake synthetic trace, as a plain JSONL file."""
    source = resources.files("kv_replay").joinpath("traces", BUILTIN_TRACES["mooncake-synthetic"])
    path = os.path.join(directory, "mooncake-prefix.jsonl")
    with source.open("rb") as raw, gzip.open(raw, "rt") as lines, open(path, "w") as out:
        out.writelines(itertools.islice((line for line in lines if line.strip()), limit))
    return path


def kvcore(
    path: str, args: argparse.Namespace, backend: kv_api.Backend, reuse_report: bool = True
) -> tuple[float, float, float, int]:
    """Best wall time of ``Replayer.run``, the hit rate, the trace's load time and slots; with
    ``reuse_report`` off, without the miss attribution the command does (the mocker has none)."""
    start = time.perf_counter()
    requests = load_trace(path, args.limit)
    load = time.perf_counter() - start
    config = model_config(
        LAYERS, args.tokens_per_block, args.blocks * 2 * BYTES_PER_TOKEN * args.tokens_per_block, BYTES_PER_TOKEN
    )
    config = dataclasses.replace(config, reuse_report=reuse_report)
    best, hit_rate, slots = float("inf"), 0.0, 0
    for _ in range(args.repeat):
        replayer = Replayer(backend, config, args.in_flight)
        start = time.perf_counter()
        result = replayer.run(requests)
        best = min(best, time.perf_counter() - start)
        slots = replayer.manager.get_storage_statistics()[0].total
        replayer.manager.shutdown()
        hit_rate = float(summary(result)["hit_rate"])
    return best, hit_rate, load, slots


def mocker(path: str, args: argparse.Namespace) -> tuple[float, float] | str:
    """Best wall time of the mocker's offline replay and its hit rate, or why it did not run."""
    try:
        core: Any = importlib.import_module("dynamo._core")
    except ImportError as exc:
        return f"ai-dynamo-runtime is not installed ({exc}); pip install 'ai-dynamo-runtime>=1.6'"
    if not hasattr(core, "run_mocker_trace_replay"):
        return "this ai-dynamo-runtime has no dynamo._core.run_mocker_trace_replay"
    engine = {
        "engine": {
            "block_size": args.tokens_per_block,
            "num_gpu_blocks": args.blocks,
            "max_num_seqs": args.in_flight,
            "enable_prefix_caching": True,
        },
        "num_gpu_blocks_is_explicit": True,
    }
    best, hit_rate = float("inf"), 0.0
    for _ in range(args.repeat):
        start = time.perf_counter()
        result = core.run_mocker_trace_replay([path], extra_engine_args=engine, trace_block_size=MOONCAKE_BLOCK)
        best = min(best, time.perf_counter() - start)
        report = result.summary
        if report["completed_requests"] != args.limit:
            return f"the mocker completed {report['completed_requests']} of {args.limit} requests"
        hit_rate = float(report["first_admission_prefix_cache_reused_ratio"])
    return best, hit_rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=1000, help="requests: the trace's first N")
    parser.add_argument("--tokens-per-block", type=int, default=32)
    parser.add_argument("--blocks", type=int, default=8192, help="device blocks (slots)")
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--backend", default="cpp")
    args = parser.parse_args()
    backend = kv_api.load_backend(args.backend)
    print(
        f"replay vs Dynamo's mocker: Mooncake synthetic, first {args.limit:,} requests, {args.blocks:,} blocks of"
        f" {args.tokens_per_block} tokens, {args.in_flight} in flight; best of {args.repeat}"
    )
    with tempfile.TemporaryDirectory(prefix="bench-replay-") as tmp:
        path = trace_prefix(args.limit, tmp)
        ours, ours_hit, load, slots = kvcore(path, args, backend)
        assert slots == args.blocks, f"the manager has {slots} slots, not {args.blocks}"
        bare, _, _, _ = kvcore(path, args, backend, reuse_report=False)
        theirs = mocker(path, args)
    print(
        f"  kvcore replay ({backend.name}): hit rate {ours_hit:.4%}, {ours * 1e3:8.1f} ms (trace load {load * 1e3:.1f} ms)"
    )
    if isinstance(theirs, str):
        print(f"  dynamo mocker: skipped: {theirs}")
        return
    mocker_time, mocker_hit = theirs
    print(f"  dynamo mocker:        hit rate {mocker_hit:.4%}, {mocker_time * 1e3:8.1f} ms")
    same = abs(ours_hit - mocker_hit) < 1e-12
    print(f"  hit rates {'identical' if same else f'DIFFER by {ours_hit - mocker_hit:+.6%}'}")
    print(
        f"  kvcore / mocker wall time: {ours / mocker_time:.2f}x (target <= 3x);"
        f" with the trace load {(ours + load) / mocker_time:.2f}x"
    )
    print(f"  without the miss attribution (reuse_report=False): {bare * 1e3:.1f} ms, {bare / mocker_time:.2f}x")


if __name__ == "__main__":
    main()
