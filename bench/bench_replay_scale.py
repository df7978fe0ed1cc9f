"""Replay time per request as the trace grows (issue 27, item 4): ``kvcore replay`` of the first
tenth, half and all of two long traces, each length a fresh process, the replay's own wall time
(the report's ``wall_seconds``: the engine loop, not the trace's load) and the whole process's,
per request, and each over the first tenth's.

- *conversation*: the conversation-style trace of bench_command.py with ``--sessions`` 2,400
  (about 12,000 requests of long, growing prompts: the size of Mooncake's conversation trace);
- *chat*: ``--requests`` synthetic requests (100,000 by default) of the same generator with short
  turns (1-3 new 512-token blocks each), sessions enough to make them.

The geometry is bench_command.py's (``--blocks`` slots of 32 tokens, 16 in flight), so the pool
is full and evicting within the first few hundred requests: what grows with the trace is the
manager's tree and the replay's own state, and flat time per request means neither costs more as
the run goes on.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time

from bench_command import conversation, kvcore_command

#: Requests per session of bench_command's generator, on average (2-8 turns).
TURNS_PER_SESSION = 5


def replay(path: str, limit: int, args: argparse.Namespace) -> tuple[float, float, int]:
    """(replay seconds, process seconds, requests) of ``kvcore replay`` of the first ``limit``
    requests of ``path``."""
    command = [*kvcore_command(path, args), "--limit", str(limit)]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"bench_replay_scale.py: {' '.join(command)} failed:\n{done.stderr}")
    report = json.loads(done.stdout)
    return float(report["wall_seconds"]), seconds, int(report["requests"])


def table(name: str, path: str, args: argparse.Namespace) -> None:
    with open(path) as f:
        total = sum(1 for _ in f)
    print(f"\n{name}: {total:,} requests")
    print("| requests | replay (s) | us per request | x | process (s) | us per request | x |")
    print("|---|---|---|---|---|---|---|")
    first: tuple[float, float] | None = None
    for limit in sorted({max(1, total // 10), max(1, total // 2), total}):
        best = min((replay(path, limit, args) for _ in range(args.repeat)), key=lambda r: r[0])
        loop, whole = best[0] / best[2], best[1] / best[2]
        first = first or (loop, whole)
        print(
            f"| {best[2]:,} | {best[0]:.2f} | {loop * 1e6:.1f} | {loop / first[0]:.2f}"
            f" | {best[1]:.2f} | {whole * 1e6:.1f} | {whole / first[1]:.2f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens-per-block", type=int, default=32)
    parser.add_argument("--blocks", type=int, default=8192, help="device blocks (slots)")
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--sessions", type=int, default=2400, help="sessions of the conversation-style trace")
    parser.add_argument("--requests", type=int, default=100_000, help="about this many requests in the chat trace")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each length (the fastest is shown)")
    parser.add_argument("--backend", default="cpp")
    args = parser.parse_args()
    for name, value in (("--sessions", args.sessions), ("--requests", args.requests), ("--repeat", args.repeat)):
        if value < 1:
            parser.error(f"{name} must be at least 1")
    print(f"replay time per request as the trace grows: {args.blocks:,} blocks of {args.tokens_per_block} tokens")
    with tempfile.TemporaryDirectory(prefix="bench-replay-scale-") as tmp:
        table("conversation-style", conversation(tmp, args.sessions), args)
        sessions = max(1, args.requests // TURNS_PER_SESSION)
        table("chat, short turns", conversation(tmp, sessions, seed=1, turn_blocks=(1, 3), name="chat"), args)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        raise SystemExit(130) from None
