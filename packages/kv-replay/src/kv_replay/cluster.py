"""A multi-instance replay: N managers with one config, each request admitted on the instance a
router picks (``kv_replay.routers``), every instance stepped as one engine.

Requests are routed in trace order, as soon as some instance has room for one more (fewer than
``max_in_flight`` open requests); the picked instance queues it if it is busy. Each global step
steps every instance that has work. The report gives each instance's summary (hit rate, requests,
peak utilisation), the cluster's hit rate (reused over prompt tokens, all instances) and the
routing time per request (inside ``pick``; for ``dynamo`` that includes publishing the events and
the barrier that waits for the indexer to apply them).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kv_api import Backend, KVCacheManagerConfig
from kv_replay.header import Setup
from kv_replay.metrics import watching
from kv_replay.plural import plural
from kv_replay.replay_result import ReplayResult
from kv_replay.replayer import Replayer
from kv_replay.report import SUMMARY_SCHEMA, latency_us, summary
from kv_replay.routers import DynamoRouter, KvOracle, RoundRobin
from kv_replay.sizes import human_size
from kv_replay.tier_errors import tier_errors
from kv_replay.trace import Request

__all__ = ["CLUSTER_SCHEMA", "ClusterResult", "cluster_report", "cluster_table", "replay_cluster"]

_SUMMARY = SUMMARY_SCHEMA["properties"]
_NAMED = ["trace", "backend", "layers", "num_layers", "tokens_per_block", "bytes_per_token"]
_QUOTAS = ["quota", "host_quota", "disk_quota"]  # each instance's
_INSTANCE = ["requests", "hit_rate", "reused_tokens", "peak_pool_utilization", "evictions"]
#: JSON Schema of one router's report (``--json`` prints one, or a list of them for a router list).
CLUSTER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": [
        *(_NAMED + _QUOTAS),
        *("router", "instances", "requests", "hit_rate", "prompt_tokens", "reused_tokens"),
        *("routing_latency_us", "per_instance", "hit_rate_without_store", "remote"),
    ],
    "properties": {
        **{key: _SUMMARY[key] for key in [*_NAMED, *_QUOTAS]},
        "router": {"type": "string"},
        "instances": {"type": "integer", "minimum": 1},
        "requests": {"type": "integer", "minimum": 0},
        "hit_rate": {"type": "number", "minimum": 0, "maximum": 1},
        "prompt_tokens": {"type": "integer", "minimum": 0},
        "reused_tokens": {"type": "integer", "minimum": 0},
        "routing_latency_us": _SUMMARY["resume_latency_us"]["properties"]["other"],  # count, mean, p50, p99
        # With --remote: the cluster's hit rate replayed without the shared store (else null).
        "hit_rate_without_store": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
        "remote": _SUMMARY["remote"],  # the instances' remote counters added up (else null)
        "per_instance": {
            "type": "array",
            "items": {
                "type": "object",
                "required": _INSTANCE,
                "properties": {key: _SUMMARY[key] for key in _INSTANCE},
                "additionalProperties": False,
            },
        },
    },
    "additionalProperties": False,
}


@dataclass
class ClusterResult:
    router: str
    instances: list[ReplayResult]
    routed: list[int] = field(default_factory=list)  # per request, the instance picked
    routing_seconds: list[float] = field(default_factory=list)  # per request


def replay_cluster(
    backend: Backend,
    config: KVCacheManagerConfig,
    requests: list[Request],
    *,
    instances: int,
    router: str,
    max_in_flight: int,
    progress: Callable[[int, int], None] | None = None,
) -> ClusterResult:
    replayers: list[Replayer] = []
    publishers: list[Any] = []  # kv_events.EventPublisher, imported only for ``dynamo``
    picker: RoundRobin | KvOracle | DynamoRouter
    try:
        for _ in range(instances):
            events = None
            if router == "dynamo":
                from kv_events import EventPublisher

                events = backend.KVCacheEventManager(1 << 20, "v2_sha256_64")
            replayers.append(Replayer(backend, config, max_in_flight, event_manager=events))
            if events is not None:
                publishers.append(EventPublisher(events, config, "tcp://127.0.0.1:*"))
        if router == "round-robin":
            picker = RoundRobin()
        elif router == "kv":
            picker = KvOracle()
        else:
            picker = DynamoRouter(publishers, config.tokens_per_block)
    except BaseException:
        for p in publishers:
            p.close()
        raise
    result = ClusterResult(router, [])
    try:
        with tier_errors(config), contextlib.ExitStack() as watched:  # a level that fails: a TierError naming it
            for i, r in enumerate(replayers):
                watched.enter_context(watching(r, engine=str(i)))
            _route(replayers, picker, requests, result, max_in_flight, progress)
    finally:
        picker.close()
    # Only after a whole replay: interrupted (Ctrl-C, SIGTERM) or failed, caches are still open
    # and shutdown() would raise over the error; the managers and their files go with the objects.
    for r in replayers:
        r.manager.shutdown()
    return result


def _route(
    replayers: list[Replayer],
    picker: RoundRobin | KvOracle | DynamoRouter,
    requests: list[Request],
    result: ClusterResult,
    max_in_flight: int,
    progress: Callable[[int, int], None] | None,
) -> None:
    """The requests in trace order, each to the instance ``picker`` picks once one has room;
    every instance with work steps once per global step."""
    for r in replayers:
        r.begin()
    queue = list(reversed(requests))
    while queue or any(r.busy for r in replayers):
        while queue and any(r.open_requests < max_in_flight for r in replayers):
            request = queue.pop()
            prompt = request.prompt  # gathered once, outside the routing's time (kv_replay.request)
            start = time.perf_counter()
            pick = picker.pick(replayers, request.scope, prompt)
            result.routing_seconds.append(time.perf_counter() - start)
            result.routed.append(pick)
            replayers[pick].submit(request, prompt)
        for r in replayers:
            if r.busy:
                r.step()
        if progress is not None:
            progress(sum(r.done for r in replayers), len(requests))
    result.instances = [r.end() for r in replayers]


def cluster_report(
    result: ClusterResult, setup: Setup | None = None, without: ClusterResult | None = None
) -> dict[str, Any]:
    """The cluster's numbers and each instance's; with ``setup`` (as the command prints it, and
    the schema asks) also what was replayed: trace, backend, layout and each instance's quotas;
    ``without``: the same cluster replayed without its shared store."""
    per = [summary(r, setup) for r in result.instances]
    prompt = sum(s["prompt_tokens"] for s in per)
    reused = sum(s["reused_tokens"] for s in per)
    named = {key: per[0][key] for key in [*_NAMED, *_QUOTAS] if key in per[0]} if per else {}
    return {
        **named,
        "router": result.router,
        "instances": len(per),
        "requests": len(result.routed),
        "hit_rate": reused / prompt if prompt else 0.0,
        "prompt_tokens": prompt,
        "reused_tokens": reused,
        "routing_latency_us": latency_us(result.routing_seconds),
        "hit_rate_without_store": None if without is None else _hit_rate(without),
        "remote": _remote_total(per),
        "per_instance": [
            {
                "requests": s["requests"],
                "hit_rate": s["hit_rate"],
                "reused_tokens": s["reused_tokens"],
                "peak_pool_utilization": s["peak_pool_utilization"],
                "evictions": s["evictions"],
            }
            for s in per
        ],
    }


def _hit_rate(result: ClusterResult) -> float:
    per = [summary(r) for r in result.instances]
    prompt = sum(s["prompt_tokens"] for s in per)
    return sum(s["reused_tokens"] for s in per) / prompt if prompt else 0.0


def _remote_total(per: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The instances' remote counters added up; the store's own are the shared store's (once)."""
    parts = [s["remote"] for s in per if s["remote"] is not None]
    if not parts:
        return None
    shared = ("store_errors", "store_dropped", "store_call_us")
    return {key: parts[0][key] if key in shared else sum(p[key] for p in parts) for key in parts[0]}


def cluster_table(reports: list[dict[str, Any]]) -> str:
    """One block per router: the cluster's line, then one line per instance."""
    lines = []
    for rep in reports:
        lat = rep["routing_latency_us"]
        lines.append(
            f"router {rep['router']}: cluster hit rate {rep['hit_rate']:.2%} over {plural(rep['requests'], 'request')} "
            f"on {plural(rep['instances'], 'instance')}; routing p50 {lat['p50']:,.1f} us, p99 {lat['p99']:,.1f} us"
        )
        if (remote := rep["remote"]) is not None:
            without = rep["hit_rate_without_store"]
            versus = "" if without is None else f" against {without:.2%} without it"
            lines.append(
                f"  shared store: cluster hit rate {rep['hit_rate']:.2%} with it{versus}; "
                f"{remote['blocks']:,} blocks from it ({human_size(remote['bytes_in'])}), "
                f"{remote['written']:,} handed to it ({human_size(remote['bytes_out'])}), "
                f"{remote['store_dropped']:,} of them dropped, "
                f"{remote['errors'] + remote['store_errors']:,} errors, calls {remote['store_call_us']:,.1f} us mean"
            )
        for i, inst in enumerate(rep["per_instance"]):
            lines.append(
                f"  instance {i}: {plural(inst['requests'], 'request')}, hit rate {inst['hit_rate']:.2%}, "
                f"peak pool utilisation {inst['peak_pool_utilization']:.1%}, evictions {inst['evictions']:,}"
            )
    return "\n".join(lines)
