"""Capability gates (``kv_api.Capabilities``): which backends a test, a fuzz run or a
differential configuration may use. A capability is named by its field; a backend declares it
when the field is true (a non-empty tuple for ``sha256_transforms``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import fields
from typing import Protocol, TypeVar

from kv_api import Capabilities

__all__ = ["CAPABILITIES", "common", "declared", "having", "lacking", "shared_options"]

#: Every capability a gate may name.
CAPABILITIES = frozenset(f.name for f in fields(Capabilities))


class _Declares(Protocol):
    @property
    def capabilities(self) -> Capabilities: ...


B = TypeVar("B", bound=_Declares)
T = TypeVar("T")


def _names(needs: Iterable[str]) -> frozenset[str]:
    """``needs`` as a set, checked: a misspelt capability would gate nothing."""
    out = frozenset(needs)
    unknown = sorted(out - CAPABILITIES)
    if unknown:
        raise ValueError(f"unknown capabilities {', '.join(unknown)} (kv_api.Capabilities has {sorted(CAPABILITIES)})")
    return out


def declared(backend: _Declares) -> frozenset[str]:
    """The capabilities ``backend`` declares."""
    caps = backend.capabilities
    return frozenset(f.name for f in fields(caps) if getattr(caps, f.name))


def lacking(backend: _Declares, needs: Iterable[str]) -> list[str]:
    """Which of ``needs`` ``backend`` lacks, in their order."""
    wanted = list(dict.fromkeys(needs))
    _names(wanted)
    have = declared(backend)
    return [n for n in wanted if n not in have]


def having(backends: Sequence[B], needs: Iterable[str]) -> list[B]:
    """The backends that declare every one of ``needs``, in their order."""
    wanted = _names(needs)
    return [b for b in backends if wanted <= declared(b)]


def common(backends: Sequence[_Declares]) -> frozenset[str]:
    """The capabilities every one of ``backends`` declares."""
    out = CAPABILITIES
    for b in backends:
        out &= declared(b)
    return out


def shared_options(
    options: Sequence[T], needs: Callable[[T], Iterable[str]], backends: Sequence[_Declares], at_least: int = 2
) -> list[T]:
    """The options (repeats kept, so their weights stay) that at least ``at_least`` of
    ``backends`` can take, ``needs(option)`` saying what an option takes: what a test comparing
    backends may draw."""
    return [o for o in options if len(having(backends, needs(o))) >= at_least]
