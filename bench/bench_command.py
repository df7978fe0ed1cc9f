"""The whole ``kvcore replay`` command against Dynamo's mocker, as processes (issue 27): start to
exit, side by side in one run, alternating, best of ``--repeat``.

Two traces, both Mooncake JSONL read from a file by both sides: the shipped Mooncake synthetic
trace (all of it), and a conversation-style trace made here (seeded): sessions of long prompts
whose turns grow the session's history, so reuse is low across sessions and the prompts are
long. The same capacity on both sides (``--tokens-per-block`` 32, ``--blocks`` slots,
``--in-flight`` 16): kvcore as ``kvcore replay TRACE --layers 1 --bytes-per-token 4 --quota Q``
on the native backend, the mocker as a Python process calling
``dynamo._core.run_mocker_trace_replay`` (PyPI ``ai-dynamo-runtime``; its row is reported and
skipped where it is not installed). Hit rates are printed beside the times: kvcore's summary
``hit_rate`` and the mocker's ``first_admission_prefix_cache_reused_ratio``.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import resources

from kv_replay.trace import BUILTIN_TRACES

BYTES_PER_TOKEN = 4  # a block of 32 tokens is 2 * 4 * 32 = 256 bytes per layer

MOCKER = """
import json, sys
from dynamo._core import run_mocker_trace_replay
path, block, blocks, seqs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
engine = {"engine": {"block_size": block, "num_gpu_blocks": blocks, "max_num_seqs": seqs,
          "enable_prefix_caching": True}, "num_gpu_blocks_is_explicit": True}
summary = run_mocker_trace_replay([path], extra_engine_args=engine, trace_block_size=512).summary
print(json.dumps({"hit_rate": summary["first_admission_prefix_cache_reused_ratio"]}))
"""


def mooncake(directory: str) -> str:
    source = resources.files("kv_replay").joinpath("traces", BUILTIN_TRACES["mooncake-synthetic"])
    path = os.path.join(directory, "mooncake-synthetic.jsonl")
    with source.open("rb") as raw, open(path, "wb") as out:
        out.write(gzip.decompress(raw.read()))
    return path


def conversation(
    directory: str, sessions: int, seed: int = 0, turn_blocks: tuple[int, int] = (2, 24), name: str = "conversation"
) -> str:
    """Sessions of 2-8 turns; a turn's prompt is the session's history (its earlier prompts and
    answers, as hash ids of 512-token blocks) plus ``turn_blocks`` (2-24) new blocks; one request
    in 10 starts with one of 4 shared system prompts. Arrivals interleave the sessions."""
    rng = random.Random(seed)
    fresh = iter(range(1 << 40))
    systems = [[next(fresh) for _ in range(rng.randint(2, 6))] for _ in range(4)]
    lines: list[tuple[float, dict[str, object]]] = []
    for _ in range(sessions):
        history = list(rng.choice(systems)) if rng.random() < 0.1 else []
        at = rng.uniform(0, sessions * 4.0)
        for _ in range(rng.randint(2, 8)):
            history += [next(fresh) for _ in range(rng.randint(*turn_blocks))]
            length = 512 * len(history) - rng.randint(0, 511)
            output = rng.randint(20, 400)
            lines.append((at, {"hash_ids": list(history), "input_length": length, "output_length": output}))
            history.append(next(fresh))  # the answer, part of the next turn's prompt
            at += rng.uniform(5, 60)
    lines.sort(key=lambda line: line[0])
    path = os.path.join(directory, f"{name}.jsonl")
    with open(path, "w") as out:
        for at, record in lines:
            out.write(json.dumps({"timestamp": round(at * 1000), **record}) + "\n")
    return path


def timed(command: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, check=True)
    return time.perf_counter() - start, done.stdout


def kvcore_command(path: str, args: argparse.Namespace) -> list[str]:
    quota = args.blocks * 2 * BYTES_PER_TOKEN * args.tokens_per_block
    kvcore = shutil.which("kvcore") or "kvcore"
    return [
        kvcore, "replay", path, "--backend", args.backend, "--layers", "1", "--bytes-per-token",
        str(BYTES_PER_TOKEN), "--tokens-per-block", str(args.tokens_per_block), "--quota", str(quota),
        "--max-in-flight", str(args.in_flight), "--quiet", "--json",
    ]  # fmt: skip


def compare(name: str, path: str, args: argparse.Namespace, mocker: bool) -> None:
    ours = kvcore_command(path, args)
    theirs = [sys.executable, "-c", MOCKER, path, str(args.tokens_per_block), str(args.blocks), str(args.in_flight)]
    best = {"kvcore": float("inf"), "mocker": float("inf")}
    hits: dict[str, float] = {}
    for _ in range(args.repeat):
        for side, command in (("kvcore", ours), ("mocker", theirs)):
            if side == "mocker" and not mocker:
                continue
            seconds, out = timed(command)
            best[side] = min(best[side], seconds)
            report = json.loads(out)
            hits[side] = float(report["hit_rate"])
    print(f"  {name}: kvcore replay ({args.backend}) {best['kvcore'] * 1e3:8.1f} ms, hit rate {hits['kvcore']:.4%}")
    if mocker:
        ratio = best["kvcore"] / best["mocker"]
        print(f"  {name}: dynamo mocker        {best['mocker'] * 1e3:8.1f} ms, hit rate {hits['mocker']:.4%}")
        print(f"  {name}: kvcore / mocker, whole processes: {ratio:.2f}x (target <= 2x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens-per-block", type=int, default=32)
    parser.add_argument("--blocks", type=int, default=8192, help="device blocks (slots)")
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--sessions", type=int, default=300, help="sessions of the conversation-style trace")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--backend", default="cpp")
    args = parser.parse_args()
    mocker = importlib.util.find_spec("dynamo") is not None
    print(
        f"the whole command vs Dynamo's mocker, as processes: {args.blocks:,} blocks of {args.tokens_per_block}"
        f" tokens, {args.in_flight} in flight; best of {args.repeat}"
    )
    if not mocker:
        print("  dynamo mocker: skipped: ai-dynamo-runtime is not installed; pip install 'ai-dynamo-runtime>=1.6'")
    with tempfile.TemporaryDirectory(prefix="bench-command-") as tmp:
        compare("Mooncake synthetic", mooncake(tmp), args, mocker)
        compare("conversation-style", conversation(tmp, args.sessions), args, mocker)


if __name__ == "__main__":
    main()
