"""The fuzz worker: a subprocess that runs cases, one at a time, on a fresh fixture of every
backend and reports their outcomes, so that a crash in native code kills only the worker.

Protocol (one JSON document per line): the worker first writes each backend's baseline state
(the fixture's observable state, taken on a fixture no case touched); then, for each case read
from stdin (``{"source": ..., "op": "eval" | "exec"}``), one list of outcomes, one per backend.

Command line: ``[--capabilities=a,b,...] BACKEND...``: the capabilities the fixture may use
(``fixture_config``; default: those every backend declares).
"""

from __future__ import annotations

import dataclasses
import enum
import faulthandler
import json
import os
import re
import sys
from array import array
from collections.abc import Collection, Iterator
from typing import Any

import kv_api
from kv_api import ReuseScope
from kv_conformance import gates
from kv_conformance.fuzz import values
from kv_conformance.tests._manager import active, committed, hybrid_config, snapshot

P0 = list(range(100, 112))
P1 = list(range(200, 206))
SCOPE1 = ReuseScope(1, None)


def fixture_config(capabilities: Collection[str]) -> kv_api.KVCacheManagerConfig:
    """The fixture's manager config: a host tier below the device where ``capabilities`` has
    one, so that calls meet pages on both levels."""
    config = hybrid_config()
    if "host_tier" not in capabilities:
        return config
    return dataclasses.replace(config, cache_tiers=[*config.cache_tiers, kv_api.HostCacheTierConfig(1 << 20)])


#: The fixture's config with every capability.
CONFIG = fixture_config(gates.CAPABILITIES)
#: What ``probe_reuse`` must keep answering alike after a failing call: both prompts, a prefix.
PROBES = [(None, P0), (SCOPE1, P1), (None, P0[:6]), (SCOPE1, P0)]
#: Items of an iterator a call returns that are read (the key iterators are lazy).
MAX_ITEMS = 64
ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def build(
    backend: kv_api.Backend, other: kv_api.Backend, source: str, config: kv_api.KVCacheManagerConfig = CONFIG
) -> dict[str, Any]:
    """The fixture, built alike on every backend, and the names a case's source may use:
    ``m`` (a manager with both prompts committed), ``c0`` (ACTIVE, 14 committed tokens of 16),
    ``c1`` (SUSPENDED, reusing P1 in SCOPE1), ``c2`` (CLOSED), ``em`` (``m``'s event manager,
    its ring holding the events so far, so that ``get_latest_events`` never waits), ``b`` (the
    backend), ``other_em`` (another backend's event manager), ``ms`` (a shut-down manager)."""
    em = backend.KVCacheEventManager(64, "v2_sha256")
    m = backend.KVCacheManager(config, em)
    committed(m, P0)
    committed(m, P1, scope=SCOPE1)
    c2 = active(m, 4, [1, 2, 3])
    c2.close()
    c0 = active(m, 16, [7, 8], reuse=P0)
    c1 = m.create_kv_cache(SCOPE1, [*P1, 9])
    em.flush_iteration_events()
    ns = values.namespace()
    ns.update(b=backend, m=m, em=em, c0=c0, c1=c1, c2=c2, P0=list(P0), P1=list(P1), CONFIG=config)
    # Built only when used: they cost a manager each.
    if re.search(r"\bms\b", source):
        ms = backend.KVCacheManager(config)
        ms.shutdown()
        ns["ms"] = ms
    if "other_em" in source:
        ns["other_em"] = other.KVCacheEventManager()
    return ns


def normalize(value: Any) -> Any:
    """A backend-independent form of a result: kv_api data types field by field (pool base
    addresses left out), arrays and views by content or layout, caches by their lengths."""
    if value is None or isinstance(value, bool | int | float | str | bytes):
        return value
    if isinstance(value, enum.Enum):
        return (type(value).__name__, value.name)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (
            type(value).__name__,
            tuple(normalize(getattr(value, f.name)) for f in dataclasses.fields(value) if f.name != "base_address"),
        )
    if isinstance(value, array):
        return ("array", value.typecode, value.tolist())
    if isinstance(value, memoryview):
        return ("memoryview", value.format, value.shape, value.strides, value.readonly)
    if isinstance(value, list | tuple):
        return [normalize(v) for v in value]
    if isinstance(value, dict):
        return sorted((repr(k), normalize(v)) for k, v in value.items())
    if isinstance(value, kv_api.KVCache):
        return (
            "KVCache",
            value.id,
            value.status.name,
            value.num_committed_tokens,
            value.history_length,
            value.capacity,
        )
    for contract in (kv_api.KVCacheManager, kv_api.KVCacheEventManager):
        if isinstance(value, contract):
            return (contract.__name__,)
    if isinstance(value, Iterator):
        return ("iterator", [normalize(v) for _, v in zip(range(MAX_ITEMS), value, strict=False)])
    return ("object", type(value).__name__)


def state(ns: dict[str, Any]) -> str:
    """The fixture's observable state (a printable form): ``_manager.snapshot`` of the open
    caches and the known prompts, plus the committed statistics, open caches, committed tokens
    and the events published so far (flushed, then drained: this ends the fixture's use)."""
    m, em, caches = ns["m"], ns["em"], [ns["c0"], ns["c1"]]
    try:
        snap = snapshot(m, caches, PROBES)
        extra = (m.get_committed_stats(), m.num_open_kv_caches, [c.committed_tokens for c in caches])
        em.flush_iteration_events()
        events = em.get_latest_events(0)
    except Exception as exc:  # noqa: BLE001 - a state that cannot be read is a state too
        return f"snapshot raised {describe(exc)}"
    return repr(normalize((snap, extra, events)))


def describe(exc: BaseException) -> str:
    return f"{qualname(type(exc))}: {message(exc)}"


def qualname(cls: type) -> str:
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def message(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception as inner:  # noqa: BLE001 - a hostile argument's repr may raise
        text = f"<str() raised {type(inner).__name__}>"
    return ADDRESS.sub(" at 0x?", text)[:400]


def run(
    backend: kv_api.Backend, other: kv_api.Backend, source: str, op: str, config: kv_api.KVCacheManagerConfig = CONFIG
) -> dict[str, Any]:
    """One case on a fresh fixture: its value or exception, and the state it leaves."""
    print(f"[{backend.name}] {source}", file=sys.stderr, flush=True)  # the last line names a crash's case
    ns = build(backend, other, source, config)
    out: dict[str, Any] = {"backend": backend.name}
    try:
        if op == "exec":
            exec(source, ns)
            value: Any = None
        else:
            value = normalize(eval(source, ns))
        out.update(raised=None, value=ADDRESS.sub(" at 0x?", repr(value)))
    except Exception as exc:  # noqa: BLE001 - the class and message are the outcome
        out.update(raised=qualname(type(exc)), message=message(exc))
    out["state"] = state(ns)
    for cache in (ns["c0"], ns["c1"]):
        cache.close()
    ns.clear()
    return out


def main(argv: list[str]) -> None:
    # The protocol keeps the real stdout; anything printed goes to stderr.
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    faulthandler.enable()
    flag = "--capabilities="
    backends = [kv_api.load_backend(name) for name in argv if not name.startswith(flag)]
    given = [a[len(flag) :].split(",") for a in argv if a.startswith(flag)]
    config = fixture_config(given[-1] if given else gates.common(backends))
    others = backends[1:] + backends[:1]
    baselines = {}
    for backend, other in zip(backends, others, strict=True):
        ns = build(backend, other, "", config)
        baselines[backend.name] = state(ns)
        ns.clear()
    proto.write(json.dumps(baselines) + "\n")
    proto.flush()
    for line in sys.stdin:
        case = json.loads(line)
        outcomes = [run(b, o, case["source"], case["op"], config) for b, o in zip(backends, others, strict=True)]
        proto.write(json.dumps(outcomes) + "\n")
        proto.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
