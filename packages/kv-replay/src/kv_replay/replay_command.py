"""``kvcore replay``: one replay per backend and quota, then the summary, sweep table and plot.

Everything that can be checked (the trace, every flag, the backends, the plot's path) is checked
before the first replay starts; a plot that fails to draw after the replays still leaves their
summary printed.

Every text report starts with what was replayed (``kv_replay.header``: trace, backend, model
layout, quotas), and the JSON has it as fields; ``--plot`` says on stderr where it wrote, as
stdout may be JSON. ``--publish`` puts the one replay's events on the wire (``kv_replay.publish``).

Host and disk tiers (``--host-quota``, ``--disk-quota``) sit below the device level; the disk
tier's files go to ``--disk-path`` or a temporary directory that is removed after the run.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from kv_api import Backend, HostCacheTierConfig, KVCacheEventManager, KVCacheManagerConfig, create_manager
from kv_api.errors import DiskOOMError, HostOOMError
from kv_replay.cluster import cluster_report, cluster_table, replay_cluster
from kv_replay.header import Setup, layout, quotas
from kv_replay.model import ModelError, model_config, unbounded_quota
from kv_replay.plot import check_output, plot_capacity, plot_replay, plot_routers
from kv_replay.plural import plural
from kv_replay.progress import ProgressBar
from kv_replay.publish import check_backend, publishing
from kv_replay.replayer import Replayer, ReplayResult, level_name
from kv_replay.report import comparison, summary, sweep, sweep_table, table, verdict
from kv_replay.sizes import format_size
from kv_replay.trace import Request, load_trace
from kv_replay.workload import default_workload


def _config(
    args: argparse.Namespace,
    quota: int,
    pool_ratio: list[float] | None = None,
    host_quota: int | None = None,
    disk: bool = True,
) -> KVCacheManagerConfig:
    """The model's config with ``quota`` on the device, a host tier of ``host_quota`` and, if
    ``disk``, the disk tier of ``--disk-quota`` in ``args.disk_dir``."""
    return model_config(
        args.layers,
        args.tokens_per_block,
        quota,
        args.bytes_per_token,
        not args.no_partial_reuse,
        pool_ratio,
        host_quota=host_quota,
        disk_quota=args.disk_quota if disk else None,
        disk_path=args.disk_dir if disk else None,
    )


def _quotas(config: KVCacheManagerConfig) -> str:
    """``64M``, ``64M + host 256M + disk 1G``: the quotas of a config's levels."""
    device, *lower = config.cache_tiers
    return " + ".join([format_size(device.quota), *(f"{level_name(t)} {format_size(t.quota)}" for t in lower)])


def _unmappable(backend: Backend, config: KVCacheManagerConfig) -> str:
    """The flag to blame when the manager cannot map a config's pools: ``--quota`` if the
    device level alone cannot be mapped, else ``--host-quota``."""
    device, *lower = config.cache_tiers
    host = next((t for t in lower if isinstance(t, HostCacheTierConfig)), None)
    if host is not None:
        try:
            create_manager(dataclasses.replace(config, cache_tiers=[device]), backend=backend).shutdown()
        except HostOOMError:
            pass
        else:
            return f"--host-quota {format_size(host.quota)}"
    return f"--quota {format_size(device.quota)}"


@contextmanager
def _manager_errors(args: argparse.Namespace, backend: Backend, config: KVCacheManagerConfig) -> Iterator[None]:
    """The manager's errors while building and replaying on ``config``, as the flag behind
    them: pools that cannot be mapped, a disk tier that is full or cannot be written."""
    try:
        yield
    except HostOOMError as exc:
        flag = _unmappable(backend, config)
        raise ModelError(f"{flag}: {exc}: more address space than this machine has") from None
    except DiskOOMError as exc:
        raise ModelError(f"--disk-quota {format_size(args.disk_quota)}: {_disk_message(args, exc)}") from None
    except OSError as exc:  # the disk tier's files; any other (a trace) is the caller's
        if args.disk_quota is None or len(config.cache_tiers) == 1 or isinstance(exc, BrokenPipeError):
            raise
        raise ModelError(f"{_disk_flag(args, exc)}: {_disk_message(args, exc)}") from None


def _run(
    args: argparse.Namespace,
    backend: Backend,
    config: KVCacheManagerConfig,
    requests: list[Request],
    events: KVCacheEventManager | None = None,
) -> ReplayResult:
    label = f"replay ({backend.name}, {_quotas(config)})"
    with _manager_errors(args, backend, config), ProgressBar(label, quiet=args.quiet, forced=args.progress) as bar:
        replayer = Replayer(backend, config, args.max_in_flight, bar.callback, event_manager=events)
        result = replayer.run(requests)
    replayer.manager.shutdown()  # every cache is closed; the disk tier's files go now
    return result


def _disk_flag(args: argparse.Namespace, exc: OSError) -> str:
    """``--disk-quota SIZE`` for a file too large or a full disk, or for the temporary
    directory it asked for; else ``--disk-path DIR``."""
    if exc.errno in (errno.EFBIG, errno.ENOSPC, errno.EDQUOT) or args.disk_path is None:
        return f"--disk-quota {format_size(args.disk_quota)}"
    return f"--disk-path {args.disk_path}"


def _disk_message(args: argparse.Namespace, exc: Exception) -> str:
    """The disk tier's error; without ``--disk-path`` it names the directory the user knows
    (``$TMPDIR``), not the temporary one inside it, which is gone when the message is read."""
    text = str(exc.strerror or exc) if isinstance(exc, OSError) else str(exc)
    return text if args.disk_path is not None else text.replace(args.disk_dir, os.path.dirname(args.disk_dir))


def check_tiers(args: argparse.Namespace, backends: list[Backend]) -> None:
    """Every backend has the tiers asked for."""
    for backend in backends:
        for flag, value, capability in (
            ("--host-quota", args.host_quota, "host_tier"),
            ("--disk-quota", args.disk_quota, "disk_tier"),
        ):
            if value is not None and not getattr(backend.capabilities, capability):
                level = capability.removesuffix("_tier")
                raise ModelError(f"{flag}: backend {backend.name!r} has no {level} tier")


def _unbounded(args: argparse.Namespace, backend: Backend, requests: list[Request]) -> ReplayResult:
    """The same replay where nothing is ever evicted: every pool group can hold the whole trace."""
    tokens = sum(len(r.prompt) + len(r.output) for r in requests)
    smallest = _config(args, 1, disk=False)
    groups = create_manager(smallest, backend=backend).pool_group_descs  # how the layers group
    quota = unbounded_quota(tokens, len(requests), smallest) * len(groups)
    # initial_pool_ratio has one entry per layer group; a pool group's layer groups share its part.
    ratio = [0.0] * sum(len(pg.life_cycles) for pg in groups)
    for pg in groups:
        for lc in pg.life_cycles:
            ratio[lc] = 1.0 / len(groups) / len(pg.life_cycles)
    return _run(args, backend, _config(args, quota, ratio, disk=False), requests)


def replay(args: argparse.Namespace, backends: list[Backend]) -> int:
    if args.plot:
        check_output(args.plot)
    check_tiers(args, backends)
    if args.publish is not None:
        check_backend(backends[0])
    if args.disk_quota is None or args.disk_path is not None:
        args.disk_dir = args.disk_path
        return _replay(args, backends)
    with tempfile.TemporaryDirectory(prefix="kvcore-replay-") as tmp:  # removed after the run
        args.disk_dir = tmp
        return _replay(args, backends)


def _wrote(path: str) -> None:
    """Where ``--plot`` wrote, on stderr (stdout may be JSON read by a program)."""
    print(f"kvcore: wrote the plot to {os.path.abspath(path)}", file=sys.stderr)


def _quotas_asked(args: argparse.Namespace) -> str:
    return quotas(args.quota, args.host_quota, args.disk_quota)


def _detail(args: argparse.Namespace, setup: Setup) -> str:
    """A plot title's last line: the model and the quotas (the title has the block size)."""
    return f"{layout(setup.layers)}, {plural(setup.bytes_per_token, 'byte')} per token  ·  {_quotas_asked(args)}"


def _cluster(
    args: argparse.Namespace, backend: Backend, config: KVCacheManagerConfig, requests: list[Request], setup: Setup
) -> int:
    """``--instances`` / ``--router``: one cluster replay per router, then their reports."""
    names = args.router or ["round-robin"]
    if "dynamo" in names:
        try:
            from kv_events.indexer import dynamo_missing
        except ImportError:
            raise ModelError("--router dynamo: kv_events is not installed (pip install ./packages/kv-events)") from None
        missing = dynamo_missing()
        if missing is not None:
            raise ModelError(f"--router dynamo: {missing}")
    reports = []
    for name in names:
        label = f"replay ({backend.name}, {plural(args.instances, 'instance')}, router {name})"
        try:
            with (
                _manager_errors(args, backend, config),
                ProgressBar(label, quiet=args.quiet, forced=args.progress) as bar,
            ):
                result = replay_cluster(
                    backend,
                    config,
                    requests,
                    instances=args.instances,
                    router=name,
                    max_in_flight=args.max_in_flight,
                    progress=bar.callback,
                )
        except RuntimeError as exc:  # the indexer failed to start or to follow
            raise ModelError(f"--router {name}: {exc}") from None
        reports.append(cluster_report(result, setup))
    if args.json:
        print(json.dumps(reports if len(reports) > 1 else reports[0], indent=2))
    else:
        routers = f"{'router' if len(names) == 1 else 'routers'} {', '.join(names)}"
        who = f"backend: {backend.name}, {plural(args.instances, 'instance')}, {routers}"
        print(setup.header(who, f"{_quotas_asked(args)} (each instance)") + "\n")
        print(cluster_table(reports))
    if args.plot:
        detail = _detail(args, setup)
        plot_routers(reports, args.plot, trace=setup.trace, tokens_per_block=args.tokens_per_block, detail=detail)
        _wrote(args.plot)
    return 0


def _replay(args: argparse.Namespace, backends: list[Backend]) -> int:
    # Every quota is valid before anything runs; one of --quota and --host-quota is a single size.
    configs = [_config(args, quota, host_quota=host) for quota in args.quota for host in args.host_quota or [None]]
    requests: list[Request] = (
        load_trace(args.trace, args.limit) if args.trace is not None else default_workload(args.seed)[: args.limit]
    )
    setup = Setup.from_args(args, len(requests))
    if args.router is not None or args.instances > 1:
        return _cluster(args, backends[0], configs[0], requests, setup)
    if len(configs) > 1:
        return _sweep(args, backends, configs, requests, setup)
    return _single(args, backends, configs[0], requests, setup)


def _single(
    args: argparse.Namespace,
    backends: list[Backend],
    config: KVCacheManagerConfig,
    requests: list[Request],
    setup: Setup,
) -> int:
    """One replay, or with ``--compare`` one per backend; published with ``--publish``."""
    if args.publish is not None:  # on one backend: the flags allow nothing else
        with publishing(args.publish, backends[0], config, args.wait_subscribers) as events:
            results = [_run(args, backends[0], config, requests, events)]
    else:
        results = [_run(args, backend, config, requests) for backend in backends]
    status = 0
    if args.compare:
        report = comparison(results, setup)
        if args.json:
            print(json.dumps(report, indent=2))
        else:
            print(setup.header(f"backends: {', '.join(b.name for b in backends)}", _quotas_asked(args)) + "\n")
            print(table(report["backends"]))
            ratios = ", ".join(f"{name} {ratio:.1f}x" for name, ratio in report["speed_ratio"].items())
            print(f"\ntime in the manager relative to the fastest: {ratios}")
            print(verdict(report["reuse_identical"]))
        status = 0 if report["reuse_identical"] else 1
    elif args.json:
        print(json.dumps(summary(results[0], setup), indent=2))
    else:
        print(setup.header(f"backend: {backends[0].name}", _quotas_asked(args)) + "\n")
        print(table([summary(results[0], setup)]))
    if args.plot:
        plot_replay(
            results,
            args.plot,
            trace=setup.trace,
            quota=args.quota[0],
            tokens_per_block=args.tokens_per_block,
            detail=_detail(args, setup),
        )
        _wrote(args.plot)
    return status


def _sweep(
    args: argparse.Namespace,
    backends: list[Backend],
    configs: list[KVCacheManagerConfig],
    requests: list[Request],
    setup: Setup,
) -> int:
    """One replay per quota and backend, plus the unbounded reference per backend."""
    rows = [_run(args, backend, config, requests) for config in configs for backend in backends]
    unbounded = [_unbounded(args, backend, requests) for backend in backends]
    report = sweep(rows, unbounded, setup)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        who = f"{'backend' if len(backends) == 1 else 'backends'}: {', '.join(b.name for b in backends)}"
        print(setup.header(who, _quotas_asked(args)) + "\n")
        print(sweep_table(report))
    if args.plot:
        host_sweep = len(args.host_quota or []) > 1
        points = {
            b.name: [
                (r.level_quotas[1] if host_sweep else r.quota, summary(r)["hit_rate"])
                for r in rows
                if r.backend == b.name
            ]
            for b in backends
        }
        ceiling = {r.backend: summary(r)["hit_rate"] for r in unbounded}
        xlabel = f"host quota (device {format_size(args.quota[0])})" if host_sweep else "device quota"
        plot_capacity(
            points,
            ceiling,
            args.plot,
            trace=setup.trace,
            tokens_per_block=args.tokens_per_block,
            xlabel=xlabel,
            detail=_detail(args, setup),
        )
        _wrote(args.plot)
    return 0 if report["reuse_identical"] else 1
