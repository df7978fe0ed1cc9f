"""Backend discovery through the ``kv_api.backends`` entry-point group.

The default backend is ``KV_BACKEND`` (a comma list, as the conformance suite accepts, picks
its first name), else the loadable backend with the highest ``priority`` (ties: name order).
Loaded backends are cached.
"""

from __future__ import annotations

import importlib.metadata
import os
from typing import cast

from kv_api.config import KVCacheManagerConfig
from kv_api.contract import BACKEND_ATTRIBUTES, Backend, KVCacheEventManager, KVCacheManager
from kv_api.errors import BackendError
from kv_api.page_copier import PageCopier

__all__ = [
    "ENTRY_POINT_GROUP",
    "available_backends",
    "create_manager",
    "default_backend_name",
    "installed_backends",
    "load_backend",
]

ENTRY_POINT_GROUP = "kv_api.backends"
_loaded: dict[str, Backend] = {}


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def installed_backends() -> tuple[str, ...]:
    """Names registered under the entry-point group, whether or not they load, in name order."""
    return tuple(sorted(_entry_points()))


def _try_load(name: str, ep: importlib.metadata.EntryPoint) -> Backend:
    try:
        obj = ep.load()
    except Exception as exc:  # a broken backend must not hide the others
        raise BackendError(f"{type(exc).__name__}: {exc}") from exc
    missing = [attr for attr in BACKEND_ATTRIBUTES if not hasattr(obj, attr)]
    if missing:
        raise BackendError(f"does not implement the Backend contract (missing: {', '.join(missing)})")
    if obj.name != name:
        raise BackendError(f"registered as {name!r} but names itself {obj.name!r}")
    if isinstance(obj.priority, bool) or not isinstance(obj.priority, int):
        raise BackendError(f"priority: expected an int, got {type(obj.priority).__name__}")
    return cast(Backend, obj)


def _failures(eps: dict[str, importlib.metadata.EntryPoint]) -> dict[str, str]:
    """Load every backend not loaded yet; why each that fails does."""
    failures = {}
    for n, ep in eps.items():
        if n in _loaded:
            continue
        try:
            _loaded[n] = _try_load(n, ep)
        except BackendError as exc:
            failures[n] = str(exc)
    return failures


def available_backends() -> tuple[str, ...]:
    """Names of the installed backends that load, highest priority first (ties: name order),
    so the first is the default unless ``KV_BACKEND`` says otherwise."""
    eps = _entry_points()
    failures = _failures(eps)
    return tuple(sorted((n for n in eps if n not in failures), key=lambda n: (-_loaded[n].priority, n)))


def _not_loaded(reason: str, eps: dict[str, importlib.metadata.EntryPoint], name: str | None = None) -> BackendError:
    """``reason``, the installed backends and why any other than ``name`` failed to load."""
    failures = _failures(eps)
    lines = [reason, f"installed backends: {', '.join(sorted(eps)) or '(none)'}"]
    lines += [f"  {n}: failed to load: {why}" for n, why in sorted(failures.items()) if n != name]
    return BackendError("\n".join(lines))


def default_backend_name() -> str:
    """``KV_BACKEND``'s first name, else the first of ``available_backends()``.
    ``BackendError`` when ``KV_BACKEND`` is unset and no installed backend loads."""
    chosen = os.environ.get("KV_BACKEND", "").split(",")[0].strip()
    if chosen and chosen != "all":
        return chosen
    available = available_backends()
    if not available:
        raise _not_loaded("no installed backend loads", _entry_points())
    return available[0]


def load_backend(name: str | None = None) -> Backend:
    """The backend called ``name`` (default: ``default_backend_name()``).

    An unknown or broken backend raises ``BackendError`` listing the installed backends and
    why any of them failed to load.
    """
    name = default_backend_name() if name is None else name
    if name in _loaded:
        return _loaded[name]
    eps = _entry_points()
    if name in eps:
        try:
            _loaded[name] = _try_load(name, eps[name])
            return _loaded[name]
        except BackendError as exc:
            reason = f"backend {name!r} failed to load: {exc}"
    else:
        reason = f"unknown backend {name!r}"
    raise _not_loaded(reason, eps, name)


def create_manager(
    config: KVCacheManagerConfig,
    *,
    backend: str | Backend | None = None,
    event_manager: KVCacheEventManager | None = None,
    page_copier: PageCopier | None = None,
) -> KVCacheManager:
    """A manager built from ``config`` on ``backend``: a name, a loaded backend, or (None) the
    default backend. ``event_manager`` must be that backend's ``KVCacheEventManager``;
    ``page_copier`` moves page bytes between memory levels (default: host-memory copies)."""
    chosen = load_backend(backend) if backend is None or isinstance(backend, str) else backend
    return chosen.KVCacheManager(config, event_manager, page_copier)
