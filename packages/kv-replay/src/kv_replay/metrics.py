"""``--metrics-port``: the managers of ``kvcore replay`` or ``kvcore engine`` as Prometheus metrics
while the command runs (docs/metrics.md).

``serving`` starts the endpoint for the whole command; each replay's managers (or each engine's)
are watched from their creation to just before their shutdown (``watching``), one ``engine``
label per instance,
and their ``resume`` calls' latencies feed the histogram. Without ``--metrics-port`` both are
no-ops, and ``kv_metrics`` (with ``prometheus_client``) is never imported."""

from __future__ import annotations

import contextlib
import contextvars
import sys
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from kv_api import KVCacheManager
from kv_replay.options import OptionError

__all__ = ["serving", "watching"]

_INSTALL = "pip install ./packages/kv-metrics"
#: The running command's collector (a ``kv_metrics.ManagerCollector``), None without the flag.
_collector: contextvars.ContextVar[Any] = contextvars.ContextVar("kvcore_metrics", default=None)


@contextlib.contextmanager
def serving(port: int | None, model_name: str) -> Iterator[None]:
    """Serve the metrics on the loopback's ``port`` (0: a free one) until the block ends; its
    address goes to stderr. Nothing where ``port`` is None."""
    if port is None:
        yield
        return
    try:
        from kv_metrics import MetricsServer
    except ImportError as exc:  # kv_metrics or prometheus_client
        raise OptionError(
            "metrics_port", f"{exc.name or 'kv_metrics'} is not installed ({_INSTALL})", str(port)
        ) from None
    try:
        server = MetricsServer(port, model_name=model_name)
    except OSError as exc:
        raise OptionError("metrics_port", exc.strerror or str(exc), str(port)) from None
    print(f"metrics: {server.url}", file=sys.stderr, flush=True)
    token = _collector.set(server.collector)
    try:
        yield
    finally:
        _collector.reset(token)
        server.close()


class Watched(Protocol):
    """What ``watching`` reports: a replayer, or the reference engine (``kv_engine.Engine``)."""

    @property
    def manager(self) -> KVCacheManager: ...

    on_resume: Callable[[float, bool], None] | None


@contextlib.contextmanager
def watching(watched: Watched, engine: str = "0") -> Iterator[None]:
    """Report ``watched``'s manager (and its resumes) under ``engine`` while the block runs."""
    collector = _collector.get()
    if collector is None:
        yield
        return
    collector.watch(watched.manager, engine=engine)
    watched.on_resume = lambda seconds, onboarding: collector.observe_resume(seconds, onboarding, engine)
    try:
        yield
    finally:
        watched.on_resume = None
        collector.forget(watched.manager)
