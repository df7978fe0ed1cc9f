"""A manager's statistics as Prometheus metrics (docs/metrics.md): ``ManagerCollector`` reads
them when a scrape asks, ``MetricsServer`` serves them over HTTP."""

from kv_metrics.manager_collector import ManagerCollector
from kv_metrics.metrics_server import MetricsServer

__all__ = ["ManagerCollector", "MetricsServer"]
