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

import gc
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Protocol

from kv_api import (
    Backend,
    BlockStore,
    DiskCacheTierConfig,
    HostCacheTierConfig,
    KVCacheEventManager,
    KVCacheManagerConfig,
    create_manager,
)
from kv_api.errors import HostOOMError
from kv_replay.cluster import ClusterResult, cluster_report, cluster_table, replay_cluster
from kv_replay.header import Setup, layout, quotas
from kv_replay.metrics import serving, watching
from kv_replay.model import ModelError, block_bytes, model_config, unbounded_quota
from kv_replay.options import OptionError, ReplayOptions
from kv_replay.plot import check_output, plot_capacity, plot_replay, plot_routers
from kv_replay.plural import plural
from kv_replay.progress import ProgressBar
from kv_replay.publish import check_backend, publishing
from kv_replay.quota_curve import QuotaCurve, curve_quotas, curve_report, curve_table, sample_rate
from kv_replay.remote_store import open_store, shown, store_stats
from kv_replay.replay_result import ReplayResult, level_name
from kv_replay.replayer import Replayer
from kv_replay.report import comparison, summary, sweep, sweep_table, table, verdict
from kv_replay.sizes import format_size
from kv_replay.stack_recorder import StackRecorder
from kv_replay.tier_errors import TierError, tier_errors
from kv_replay.trace import Request, load_trace
from kv_replay.workload import default_workload


def _config(
    options: ReplayOptions,
    quota: int,
    pool_ratio: list[float] | None = None,
    host_quota: int | None = None,
    disk_dir: str | None = None,
    store: BlockStore | None = None,
) -> KVCacheManagerConfig:
    """The model's config with ``quota`` on the device, a host tier of ``host_quota``, given
    ``disk_dir`` the disk tier of ``--disk-quota`` there, and given a ``store`` the remote tier."""
    return model_config(
        options.layers,
        options.tokens_per_block,
        quota,
        options.bytes_per_token,
        options.partial_reuse,
        pool_ratio,
        host_quota=host_quota,
        disk_quota=options.disk_quota if disk_dir is not None else None,
        disk_path=disk_dir,
        remote=store,
    )


def _quotas(config: KVCacheManagerConfig) -> str:
    """``64M``, ``64M + host 256M + disk 1G + remote``: the quotas of a config's levels."""
    device, *lower = config.local_tiers
    remote = [] if config.remote_tier is None else ["remote"]
    return " + ".join([format_size(device.quota), *(f"{level_name(t)} {format_size(t.quota)}" for t in lower), *remote])


@contextmanager
def _option_errors(options: ReplayOptions) -> Iterator[None]:
    """A cache level the manager failed on (``TierError``) as the option that set it."""
    try:
        yield
    except TierError as exc:
        raise _blame(options, exc) from None


def _blame(options: ReplayOptions, exc: TierError) -> ModelError:
    """Memory that cannot be mapped names the level's quota (``--quota``, ``--host-quota``); a
    disk tier's failure names ``--disk-path DIR`` if it was the directory the user gave, else
    ``--disk-quota SIZE``: the files' size, or the temporary directory made for it."""
    tier = exc.tier
    if isinstance(exc.error, HostOOMError):
        field = "host_quota" if isinstance(tier, HostCacheTierConfig) else "quota"
        return ModelError(field, f"{exc.error}: more address space than this machine has", format_size(tier.quota))
    assert isinstance(tier, DiskCacheTierConfig)
    why = _disk_message(options, tier.path, exc.error)
    if exc.field == "path" and options.disk_path is not None:
        return ModelError("disk_path", why, options.disk_path)
    return ModelError("disk_quota", why, format_size(tier.quota))


def _disk_message(options: ReplayOptions, directory: str, exc: Exception) -> str:
    """The disk tier's error; without ``--disk-path`` it names the directory the user knows
    (``$TMPDIR``), not the temporary one inside it, which is gone when the message is read."""
    text = str(exc.strerror or exc) if isinstance(exc, OSError) else str(exc)
    return text if options.disk_path is not None else text.replace(directory, os.path.dirname(directory))


def _run(
    options: ReplayOptions,
    backend: Backend,
    config: KVCacheManagerConfig,
    requests: list[Request],
    events: KVCacheEventManager | None = None,
    recorder: StackRecorder | None = None,
) -> ReplayResult:
    label = f"replay ({backend.name}, {_quotas(config)})"
    with _option_errors(options), ProgressBar(label, quiet=options.quiet, forced=options.progress) as bar:
        replayer = Replayer(backend, config, options.max_in_flight, bar.callback, event_manager=events)
        replayer.recorder = recorder
        with watching(replayer):
            result = replayer.run(requests)
    replayer.manager.shutdown()  # every cache is closed; the disk tier's files go now
    if config.remote_tier is not None:
        result.store = store_stats(config.remote_tier.store)
    return result


class TierOptions(Protocol):
    """The tier flags ``check_tiers`` reads (of ``kvcore replay`` or ``kvcore engine``)."""

    @property
    def host_quota(self) -> object: ...
    @property
    def disk_quota(self) -> object: ...


def check_tiers(options: TierOptions, backends: list[Backend]) -> None:
    """Every backend has the tiers asked for."""
    for backend in backends:
        for field, value, capability in (
            ("host_quota", options.host_quota, "host_tier"),
            ("disk_quota", options.disk_quota, "disk_tier"),
            ("remote", getattr(options, "remote", None), "remote_tier"),  # kvcore engine has none yet
        ):
            if value is not None and not getattr(backend.capabilities, capability):
                level = capability.removesuffix("_tier")
                raise ModelError(field, f"backend {backend.name!r} has no {level} tier")


def _unbounded(
    options: ReplayOptions, backend: Backend, requests: list[Request], recorder: StackRecorder | None = None
) -> ReplayResult:
    """The same replay where nothing is ever evicted: every pool group can hold the whole trace."""
    tokens = sum(r.prompt_length + len(r.output) for r in requests)
    smallest = _config(options, 1)
    groups = create_manager(smallest, backend=backend).pool_group_descs  # how the layers group
    quota = unbounded_quota(tokens, len(requests), smallest) * len(groups)
    # initial_pool_ratio has one entry per layer group; a pool group's layer groups share its part.
    ratio = [0.0] * sum(len(pg.life_cycles) for pg in groups)
    for pg in groups:
        for lc in pg.life_cycles:
            ratio[lc] = 1.0 / len(groups) / len(pg.life_cycles)
    return _run(options, backend, _config(options, quota, ratio), requests, recorder=recorder)


def replay(options: ReplayOptions, backends: list[Backend]) -> int:
    if options.plot:
        check_output(options.plot)
    check_tiers(options, backends)
    if options.publish is not None:
        check_backend(backends[0])
    with ExitStack() as stack:  # the store and a temporary disk directory go after the run, whatever ends it
        store = stack.enter_context(open_store(options.remote)) if options.remote is not None else None
        disk_dir = options.disk_path
        if options.disk_quota is not None and disk_dir is None:
            disk_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="kvcore-replay-"))
        model_name = os.path.basename(options.trace) if options.trace else "embedded"
        stack.enter_context(serving(options.metrics_port, model_name))
        return _replay(options, backends, disk_dir, store)


def _wrote(path: str) -> None:
    """Where ``--plot`` wrote, on stderr (stdout may be JSON read by a program)."""
    print(f"kvcore: wrote the plot to {os.path.abspath(path)}", file=sys.stderr)


def _quotas_asked(options: ReplayOptions) -> str:
    return quotas(
        options.quota, options.host_quota, options.disk_quota, None if options.remote is None else shown(options.remote)
    )


def _detail(options: ReplayOptions, setup: Setup) -> str:
    """A plot title's last line: the model and the quotas (the title has the block size)."""
    return f"{layout(setup.layers)}, {plural(setup.bytes_per_token, 'byte')} per token  ·  {_quotas_asked(options)}"


def _cluster(
    options: ReplayOptions,
    backend: Backend,
    config: KVCacheManagerConfig,
    requests: list[Request],
    setup: Setup,
    baseline: KVCacheManagerConfig | None = None,
) -> int:
    """``--instances`` / ``--router``: one cluster replay per router, then their reports. With
    ``--remote``, each router's cluster replays first without the shared store (``baseline``),
    then with it: the hit rate the store adds is the headline."""
    names = options.router or ("round-robin",)
    if "dynamo" in names:
        try:
            from kv_events.indexer import dynamo_missing
        except ImportError:
            raise OptionError(
                "router", "kv_events is not installed (pip install ./packages/kv-events)", "dynamo"
            ) from None
        missing = dynamo_missing()
        if missing is not None:
            raise OptionError("router", missing, "dynamo")
    reports = []
    for name in names:
        without = None if baseline is None else _cluster_run(options, backend, baseline, requests, name, "no store")
        result = _cluster_run(options, backend, config, requests, name)
        if config.remote_tier is not None:
            for instance in result.instances:  # the store all of them shared
                instance.store = store_stats(config.remote_tier.store)
        reports.append(cluster_report(result, setup, without))
    if options.json:
        print(json.dumps(reports if len(reports) > 1 else reports[0], indent=2))
    else:
        routers = f"{'router' if len(names) == 1 else 'routers'} {', '.join(names)}"
        who = f"backend: {backend.name}, {plural(options.instances, 'instance')}, {routers}"
        print(setup.header(who, f"{_quotas_asked(options)} (each instance)") + "\n")
        print(cluster_table(reports))
    if options.plot:
        detail = _detail(options, setup)
        plot_routers(reports, options.plot, trace=setup.trace, tokens_per_block=options.tokens_per_block, detail=detail)
        _wrote(options.plot)
    return 0


def _cluster_run(
    options: ReplayOptions,
    backend: Backend,
    config: KVCacheManagerConfig,
    requests: list[Request],
    router: str,
    note: str = "",
) -> ClusterResult:
    label = (
        f"replay ({backend.name}, {plural(options.instances, 'instance')}, router {router}{', ' * bool(note)}{note})"
    )
    try:
        with (
            _option_errors(options),
            ProgressBar(label, quiet=options.quiet, forced=options.progress) as bar,
        ):
            return replay_cluster(
                backend,
                config,
                requests,
                instances=options.instances,
                router=router,
                max_in_flight=options.max_in_flight,
                progress=bar.callback,
            )
    except RuntimeError as exc:  # the indexer failed to start or to follow
        raise OptionError("router", str(exc), router) from None


def _replay(options: ReplayOptions, backends: list[Backend], disk_dir: str | None, store: BlockStore | None) -> int:
    # Every quota is valid before anything runs; one of --quota and --host-quota is a single size.
    configs = [
        _config(options, quota, host_quota=host, disk_dir=disk_dir, store=store)
        for quota in options.quota
        for host in options.host_quota or (None,)
    ]
    requests: list[Request] = (
        load_trace(options.trace, options.limit)
        if options.trace is not None
        else default_workload(options.seed)[: options.limit]
    )
    setup = Setup.from_options(options, len(requests))
    # What is loaded by now (modules, the trace) lives to the end: the collector's full passes
    # need not walk it again (they cost ~1-2% of a Mooncake replay; a replay makes no cycles of it).
    gc.freeze()
    if options.quota_curve:
        return _curve(options, backends[0], requests, setup)
    if options.clustered:
        host = options.host_quota[0] if options.host_quota else None
        baseline = _config(options, options.quota[0], host_quota=host, disk_dir=disk_dir) if store else None
        return _cluster(options, backends[0], configs[0], requests, setup, baseline)
    if len(configs) > 1:
        return _sweep(options, backends, configs, requests, setup)
    return _single(options, backends, configs[0], requests, setup)


def _single(
    options: ReplayOptions,
    backends: list[Backend],
    config: KVCacheManagerConfig,
    requests: list[Request],
    setup: Setup,
) -> int:
    """One replay, or with ``--compare`` one per backend; published with ``--publish``."""
    if options.publish is not None:  # on one backend: the flags allow nothing else
        with publishing(options.publish, backends[0], config, options.wait_subscribers) as events:
            results = [_run(options, backends[0], config, requests, events)]
    else:
        results = [_run(options, backend, config, requests) for backend in backends]
    status = 0
    if options.compare:
        report = comparison(results, setup)
        if options.json:
            print(json.dumps(report, indent=2))
        else:
            print(setup.header(f"backends: {', '.join(b.name for b in backends)}", _quotas_asked(options)) + "\n")
            print(table(report["backends"]))
            ratios = ", ".join(f"{name} {ratio:.1f}x" for name, ratio in report["speed_ratio"].items())
            print(f"\ntime in the manager relative to the fastest: {ratios}")
            print(verdict(report["reuse_identical"]))
        status = 0 if report["reuse_identical"] else 1
    elif options.json:
        print(json.dumps(summary(results[0], setup), indent=2))
    else:
        print(setup.header(f"backend: {backends[0].name}", _quotas_asked(options)) + "\n")
        print(table([summary(results[0], setup)]))
    if options.plot:
        plot_replay(
            results,
            options.plot,
            trace=setup.trace,
            quota=options.quota[0],
            tokens_per_block=options.tokens_per_block,
            detail=_detail(options, setup),
        )
        _wrote(options.plot)
    return status


def _sweep(
    options: ReplayOptions,
    backends: list[Backend],
    configs: list[KVCacheManagerConfig],
    requests: list[Request],
    setup: Setup,
) -> int:
    """One replay per quota and backend, plus the unbounded reference per backend."""
    rows = [_run(options, backend, config, requests) for config in configs for backend in backends]
    unbounded = [_unbounded(options, backend, requests) for backend in backends]
    report = sweep(rows, unbounded, setup)
    if options.json:
        print(json.dumps(report, indent=2))
    else:
        who = f"{'backend' if len(backends) == 1 else 'backends'}: {', '.join(b.name for b in backends)}"
        print(setup.header(who, _quotas_asked(options)) + "\n")
        print(sweep_table(report))
    if options.plot:
        host_sweep = len(options.host_quota or ()) > 1
        points = {
            b.name: [
                (r.level_quotas[1] if host_sweep else r.quota, summary(r)["hit_rate"])
                for r in rows
                if r.backend == b.name
            ]
            for b in backends
        }
        ceiling = {r.backend: summary(r)["hit_rate"] for r in unbounded}
        xlabel = f"host quota (device {format_size(options.quota[0])})" if host_sweep else "device quota"
        plot_capacity(
            points,
            ceiling,
            options.plot,
            trace=setup.trace,
            tokens_per_block=options.tokens_per_block,
            xlabel=xlabel,
            detail=_detail(options, setup),
        )
        _wrote(options.plot)
    return 0 if report["reuse_identical"] else 1


def _device_slots(options: ReplayOptions, backend: Backend, quota: int) -> int:
    """The slots a device quota gives (the manager's sizing; one pool group)."""
    config = _config(options, quota)
    with _option_errors(options), tier_errors(config):
        manager = create_manager(config, backend=backend)
    try:
        return manager.get_storage_statistics()[0].total
    finally:
        manager.shutdown()


def _curve(options: ReplayOptions, backend: Backend, requests: list[Request], setup: Setup) -> int:
    """``--quota-curve``: one replay at an unbounded quota whose stack distances estimate the
    hit rate at every device quota (``kv_replay.quota_curve``)."""
    # Each asked quota's slots, now: one that cannot be mapped fails before the replay.
    asked = {quota: _device_slots(options, backend, quota) for quota in options.quota}
    start = time.perf_counter()
    recorder = StackRecorder(options.tokens_per_block, sample_rate(requests, options.tokens_per_block))
    result = _unbounded(options, backend, requests, recorder)
    unbounded = summary(result, setup)
    curve = QuotaCurve.of(recorder, unbounded["prompt_tokens"])
    seconds = time.perf_counter() - start
    slot_bytes = block_bytes(_config(options, options.quota[0]))
    peak = math.ceil(unbounded["peak_pool_utilization"] * _device_slots(options, backend, result.quota))
    quotas = curve_quotas(curve, slot_bytes, options.quota, peak)
    named = {"trace": setup.trace, "backend": backend.name, **setup.layout_fields()}

    def slots_of(quota: int) -> int:
        return asked[quota] if quota in asked else _device_slots(options, backend, quota)

    report = curve_report(curve, quotas, slots_of, unbounded, peak, named, seconds)
    if options.json:
        print(json.dumps(report, indent=2))
    else:
        print(setup.header(f"backend: {backend.name}", "device, every quota (estimated); no host or disk tier") + "\n")
        print(curve_table(report))
    if options.plot:
        points = {f"{backend.name}, estimated": [(p["quota"], p["hit_rate"]) for p in report["quota_curve"]]}
        plot_capacity(
            points,
            {backend.name: unbounded["hit_rate"]},
            options.plot,
            floor=peak * slot_bytes,
            trace=setup.trace,
            tokens_per_block=options.tokens_per_block,
            detail=f"{layout(setup.layers)}, {plural(setup.bytes_per_token, 'byte')} per token  ·  "
            "estimated from one replay at an unbounded quota",
        )
        _wrote(options.plot)
    return 0
