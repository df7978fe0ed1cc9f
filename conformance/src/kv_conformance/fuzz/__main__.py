"""``python -m kv_conformance.fuzz [--cases N] [--seed S] [--backends all|py,cpp] [--strict]``:
a longer fuzz run than the suite's, printing the report (one per set of capabilities the
backends declare: ``runner.plan``); ``--repro '<case>'`` runs one case, on a fixture of the
capabilities every backend declares, and prints every backend's outcome."""

from __future__ import annotations

import argparse
import json
import random
import sys

import kv_api
from kv_conformance.fuzz import Case, generate, plan, run
from kv_conformance.fuzz.runner import Worker, classify, outcome_text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kv_conformance.fuzz", description=__doc__)
    parser.add_argument("--cases", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=None, help="default: a random one (printed)")
    parser.add_argument("--backends", default="all", help="'all' or a comma list; the first is the reference")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds a case may run")
    parser.add_argument("--limit", type=int, default=200, help="new findings printed at most")
    parser.add_argument("--strict", action="store_true", help="exit 1 on a new finding or a stale known divergence")
    parser.add_argument("--repro", metavar="CASE", help='run one case, e.g. "c0.resize(2**70)"')
    args = parser.parse_args(argv)
    names = list(kv_api.available_backends()) if args.backends == "all" else args.backends.split(",")
    names.sort(key=lambda n: n != "py")  # the readable reference first
    if args.repro:
        case = Case.parse(args.repro)
        worker = Worker(names)
        result = worker.run(case, args.timeout)
        worker.close()
        if isinstance(result, str):
            print(result)
            return 1
        print("\n".join(outcome_text(o) for o in result))
        findings = classify(case, result, worker.baselines)
        print("\n".join(f.format() for f in findings) or "no finding")
        return 1 if findings else 0
    seed = random.randrange(2**32) if args.seed is None else args.seed
    failed = False
    # One run per set of capabilities the backends declare (runner.plan): all alike, one run.
    for i, (group, caps) in enumerate(plan(names)):
        print(f"fuzz: {args.cases} cases, seed {seed}, backends {', '.join(group)}", flush=True)
        cases = generate(args.cases, seed, caps)
        report = run(group, cases, timeout=args.timeout, with_pinned=i == 0, capabilities=caps)
        print(report.format(args.limit))
        print(json.dumps({"cases": report.cases, "seconds": round(report.seconds, 2), **report.counts()}))
        failed = failed or bool(report.unknown or report.stale)
    return 1 if args.strict and failed else 0


if __name__ == "__main__":
    sys.exit(main())
