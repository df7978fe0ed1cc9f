"""An HTTP endpoint Prometheus scrapes (``GET /metrics``), serving one ``ManagerCollector`` from
a thread of its own until closed (docs/metrics.md)."""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from kv_metrics.manager_collector import ManagerCollector

__all__ = ["MetricsServer"]


class MetricsServer:
    """Serves ``collector`` (a new one of ``model_name`` by default) on ``host:port``; port 0
    picks a free one (``port`` says which). The default host is the loopback: KV statistics are
    an engine's internals, so exposing them further is the caller's explicit choice. Raises
    ``OSError`` where the address cannot be bound."""

    def __init__(
        self, port: int, host: str = "127.0.0.1", collector: ManagerCollector | None = None, model_name: str = "kvcore"
    ) -> None:
        self.collector = collector if collector is not None else ManagerCollector(model_name)
        self.registry = CollectorRegistry()
        self.registry.register(self.collector)
        self._server: Any
        self._thread: threading.Thread
        self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        self.host = host
        self.port = int(self._server.server_port)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and release the port (idempotent)."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
