"""The ``kvcore`` command: ``kvcore replay`` (the main job) and ``kvcore backends``."""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import fields
from typing import Any

import kv_api
from kv_api.errors import BackendError
from kv_replay.model import model_config
from kv_replay.plot import PlotUnavailable, plot
from kv_replay.progress import ProgressBar
from kv_replay.replayer import Replayer
from kv_replay.report import comparison, summary, table
from kv_replay.trace import Request, TraceError, load_trace
from kv_replay.workload import default_workload

_SIZE = re.compile(r"^(\d+)([KMG]i?B?|B)?$", re.IGNORECASE)


def byte_size(text: str) -> int:
    """``"268435456"``, ``"256M"``, ``"1G"`` or ``"512MiB"`` as bytes."""
    m = _SIZE.match(text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 268435456, 256M, 1G)")
    unit = (m.group(2) or "B")[0].upper()
    return int(m.group(1)) << {"B": 0, "K": 10, "M": 20, "G": 30}[unit]


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 (got {value})")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvcore", description="kvcore: a KV-cache manager for LLM inference")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("replay", help="replay a workload through the manager and report reuse, memory and latency")
    r.add_argument("trace", nargs="?", help="Mooncake or kvcore JSONL trace (default: the embedded workload)")
    r.add_argument("--backend", help="backend to use (default: $KV_BACKEND, else cpp, else py)")
    r.add_argument("--tokens-per-block", type=positive, default=32, metavar="N")
    r.add_argument(
        "--quota", type=byte_size, default=byte_size("128M"), metavar="BYTES", help="device quota (default 128M)"
    )
    r.add_argument(
        "--layers", default="4", metavar="SPEC", help="COUNT[xWINDOW][+SINKS],... (default: 4 full-attention layers)"
    )
    r.add_argument(
        "--bytes-per-token", type=positive, default=256, metavar="N", help="bytes of K (and of V) per token and layer"
    )
    r.add_argument("--max-in-flight", type=positive, default=16, metavar="N")
    r.add_argument("--seed", type=int, default=0, metavar="N", help="seed of the embedded workload")
    r.add_argument("--limit", type=positive, metavar="N", help="replay only the first N requests")
    r.add_argument("--no-partial-reuse", action="store_true", help="reuse whole blocks only")
    r.add_argument("--json", action="store_true", help="print the summary as JSON (schema: docs/replay.md)")
    r.add_argument("--plot", metavar="FILE.png", help="draw hit rate and pool utilisation over the replay")
    r.add_argument("--compare", action="store_true", help="replay on every installed backend; fail if reuse differs")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    sub.add_parser("backends", help="list installed backends and their build info")
    return p


def backends() -> int:
    """Print every installed backend, its version, build info and capabilities."""
    loadable = kv_api.available_backends()
    print(f"default backend: {kv_api.default_backend_name()}")
    status = 0
    for name in kv_api.installed_backends():
        if name not in loadable:
            try:
                kv_api.load_backend(name)
            except BackendError as exc:
                print(f"{name}: failed to load\n  {exc}")
                status = 1
            continue
        b = kv_api.load_backend(name)
        print(f"{name} {b.version}")
        for key, value in b.build_info().items():
            print(f"  {key}: {value}")
        caps = ", ".join(f"{f.name}={getattr(b.capabilities, f.name)}" for f in fields(b.capabilities))
        print(f"  capabilities: {caps}")
    return status


def replay(args: argparse.Namespace) -> int:
    requests: list[Request] = load_trace(args.trace) if args.trace else default_workload(args.seed)
    if args.limit:
        requests = requests[: args.limit]
    config = model_config(
        args.layers, args.tokens_per_block, args.quota, args.bytes_per_token, not args.no_partial_reuse
    )
    names = list(kv_api.available_backends()) if args.compare else [args.backend or kv_api.default_backend_name()]
    chosen = [kv_api.load_backend(n) for n in names]  # fails before anything runs
    results = []
    for backend in chosen:
        progress = None if args.quiet else ProgressBar(f"replay ({backend.name})")
        results.append(Replayer(backend, config, args.max_in_flight, progress).run(requests))
    if args.plot:
        plot(results, args.plot)
    if args.compare:
        report: Any = comparison(results)
        if args.json:
            print(json.dumps(report, indent=2))
        else:
            print(table(report["backends"]))
            ratios = ", ".join(f"{name} {ratio:.1f}x" for name, ratio in report["speed_ratio"].items())
            print(f"\ntime in the manager relative to the fastest: {ratios}")
            print("reuse identical on every backend" if report["reuse_identical"] else "REUSE DIFFERS between backends")
        return 0 if report["reuse_identical"] else 1
    s = summary(results[0])
    print(json.dumps(s, indent=2) if args.json else table([s]))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "backends":
            return backends()
        return replay(args)
    except (TraceError, BackendError, PlotUnavailable, ValueError, OSError) as exc:
        print(f"kvcore: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
