"""``kvcore replay``: one replay per backend and quota, then the summary, sweep table and plot.

Everything that can be checked (the trace, every flag, the backends, the plot's path) is checked
before the first replay starts; a plot that fails to draw after the replays still leaves their
summary printed.
"""

from __future__ import annotations

import argparse
import json

from kv_api import Backend, KVCacheManagerConfig, create_manager
from kv_api.errors import HostOOMError
from kv_replay.model import ModelError, model_config, unbounded_quota
from kv_replay.plot import check_output, plot_capacity, plot_replay
from kv_replay.progress import ProgressBar
from kv_replay.replayer import Replayer, ReplayResult
from kv_replay.report import comparison, summary, sweep, sweep_table, table, verdict
from kv_replay.sizes import format_size
from kv_replay.trace import Request, load_trace
from kv_replay.workload import default_workload


def _config(args: argparse.Namespace, quota: int, pool_ratio: list[float] | None = None) -> KVCacheManagerConfig:
    return model_config(
        args.layers, args.tokens_per_block, quota, args.bytes_per_token, not args.no_partial_reuse, pool_ratio
    )


def _run(
    args: argparse.Namespace, backend: Backend, config: KVCacheManagerConfig, requests: list[Request]
) -> ReplayResult:
    quota = config.cache_tiers[0].quota
    label = f"replay ({backend.name}, {format_size(quota)})"
    try:
        replayer = Replayer(backend, config, args.max_in_flight, None if args.quiet else ProgressBar(label))
    except HostOOMError as exc:
        raise ModelError(f"--quota {format_size(quota)}: {exc}: more address space than this machine has") from None
    return replayer.run(requests)


def _unbounded(args: argparse.Namespace, backend: Backend, requests: list[Request]) -> ReplayResult:
    """The same replay where nothing is ever evicted: every pool group can hold the whole trace."""
    tokens = sum(len(r.prompt) + len(r.output) for r in requests)
    smallest = _config(args, 1)
    groups = create_manager(smallest, backend=backend).pool_group_descs  # how the layers group
    quota = unbounded_quota(tokens, len(requests), smallest) * len(groups)
    # initial_pool_ratio has one entry per layer group; a pool group's layer groups share its part.
    ratio = [0.0] * sum(len(pg.life_cycles) for pg in groups)
    for pg in groups:
        for lc in pg.life_cycles:
            ratio[lc] = 1.0 / len(groups) / len(pg.life_cycles)
    return _run(args, backend, _config(args, quota, ratio), requests)


def replay(args: argparse.Namespace, backends: list[Backend]) -> int:
    if args.plot:
        check_output(args.plot)
    configs = [_config(args, quota) for quota in args.quota]  # every quota is valid before anything runs
    trace = args.trace or "embedded workload"
    requests: list[Request] = (
        load_trace(args.trace, args.limit) if args.trace else default_workload(args.seed)[: args.limit]
    )
    if len(configs) > 1:
        return _sweep(args, backends, configs, requests, trace)
    results = [_run(args, backend, configs[0], requests) for backend in backends]
    if args.compare:
        report = comparison(results)
        if args.json:
            print(json.dumps(report, indent=2))
        else:
            print(table(report["backends"]))
            ratios = ", ".join(f"{name} {ratio:.1f}x" for name, ratio in report["speed_ratio"].items())
            print(f"\ntime in the manager relative to the fastest: {ratios}")
            print(verdict(report["reuse_identical"]))
        status = 0 if report["reuse_identical"] else 1
    else:
        s = summary(results[0])
        print(json.dumps(s, indent=2) if args.json else table([s]))
        status = 0
    if args.plot:
        plot_replay(results, args.plot, trace=trace, quota=args.quota[0], tokens_per_block=args.tokens_per_block)
    return status


def _sweep(
    args: argparse.Namespace,
    backends: list[Backend],
    configs: list[KVCacheManagerConfig],
    requests: list[Request],
    trace: str,
) -> int:
    """One replay per quota and backend, plus the unbounded reference per backend."""
    rows = [_run(args, backend, config, requests) for config in configs for backend in backends]
    unbounded = [_unbounded(args, backend, requests) for backend in backends]
    report = sweep(rows, unbounded)
    print(json.dumps(report, indent=2) if args.json else sweep_table(report))
    if args.plot:
        points = {b.name: [(r.quota, summary(r)["hit_rate"]) for r in rows if r.backend == b.name] for b in backends}
        ceiling = {r.backend: summary(r)["hit_rate"] for r in unbounded}
        plot_capacity(points, ceiling, args.plot, trace=trace, tokens_per_block=args.tokens_per_block)
    return 0 if report["reuse_identical"] else 1
