"""The one-pass capacity curve against the sweep it replaces (issue 28, item 2): ``kvcore replay
TRACE --quota-curve`` and ``kvcore replay TRACE --quota 256M,1G,4G,16G``, each a whole process,
side by side in one run on the same trace (the shipped Mooncake trace by default). Prints each
quota's replayed and estimated hit rate and their difference in points, and both processes'
times with their ratio.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import time
from typing import Any

from kv_replay.sizes import format_size

QUOTAS = "256M,1G,4G,16G"


def kvcore(*args: str) -> tuple[dict[str, Any], float]:
    """The JSON report of ``kvcore replay ARGS --json --quiet`` and the process's seconds."""
    command = [shutil.which("kvcore") or "kvcore", "replay", *args, "--json", "--quiet"]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"bench_quota_curve.py: {' '.join(command)} failed:\n{done.stderr}")
    return json.loads(done.stdout), seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace", nargs="?", default="mooncake-synthetic")
    p.add_argument("--quota", default=QUOTAS, help=f"the swept quotas (default: {QUOTAS})")
    p.add_argument("--limit", type=int, help="the first N requests only")
    args = p.parse_args()
    common = [args.trace, "--quota", args.quota, *(["--limit", str(args.limit)] if args.limit else [])]
    curve, curve_seconds = kvcore(*common, "--quota-curve")
    sweep, sweep_seconds = kvcore(*common)
    estimated = {p["quota"]: p for p in curve["quota_curve"]}
    print(f"{args.trace}: capacity curve from one replay against a sweep of {args.quota}")
    print(f"{'quota':>14}  {'replayed':>9}  {'estimated':>9}  {'points':>7}")
    worst = 0.0
    for row in sweep["rows"]:
        point = estimated[row["quota"]]
        points = 100 * (point["hit_rate"] - row["hit_rate"])
        worst = max(worst, abs(points))
        mark = " (below the peak in use)" if point["below_peak_in_use"] else ""
        print(
            f"{format_size(row['quota']):>14}  {row['hit_rate']:>9.2%}  {point['hit_rate']:>9.2%}  {points:>+7.2f}{mark}"
        )
    print(f"worst difference: {worst:.2f} points; sampled {curve['sample_rate']:.1%} of the blocks")
    print(
        f"time: --quota-curve {curve_seconds:.1f} s (the replay and estimate {curve['seconds']:.1f} s), "
        f"sweep {sweep_seconds:.1f} s: {curve_seconds / sweep_seconds:.2f}x"
    )


if __name__ == "__main__":
    main()
