"""Backend discovery through the ``kv_api.backends`` entry-point group.

``KV_BACKEND`` names the default backend (``cpp`` when installed, else ``py``); a comma list
(as the conformance suite accepts) picks its first name. Loaded backends are cached.
"""

from __future__ import annotations

import importlib.metadata
import os
from typing import cast

from kv_api.contract import BACKEND_ATTRIBUTES, Backend
from kv_api.errors import BackendError

__all__ = ["ENTRY_POINT_GROUP", "available_backends", "default_backend_name", "installed_backends", "load_backend"]

ENTRY_POINT_GROUP = "kv_api.backends"
_PREFERRED = ("cpp", "py")
_loaded: dict[str, Backend] = {}


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def _ordered(names: list[str]) -> tuple[str, ...]:
    rank = {n: i for i, n in enumerate(_PREFERRED)}
    return tuple(sorted(names, key=lambda n: (rank.get(n, len(rank)), n)))


def installed_backends() -> tuple[str, ...]:
    """Names registered under the entry-point group, whether or not they load."""
    return _ordered(list(_entry_points()))


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
    return cast(Backend, obj)


def _failures(eps: dict[str, importlib.metadata.EntryPoint]) -> dict[str, str]:
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
    """Names of the installed backends that load."""
    eps = _entry_points()
    failures = _failures(eps)
    return _ordered([n for n in eps if n not in failures])


def default_backend_name() -> str:
    chosen = os.environ.get("KV_BACKEND", "").split(",")[0].strip()
    if chosen and chosen != "all":
        return chosen
    installed = installed_backends()
    for name in _PREFERRED:
        if name in installed:
            return name
    return installed[0] if installed else "py"


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
    failures = _failures(eps)
    lines = [reason, f"installed backends: {', '.join(_ordered(list(eps))) or '(none)'}"]
    lines += [f"  {n}: failed to load: {why}" for n, why in sorted(failures.items()) if n != name]
    raise BackendError("\n".join(lines))
