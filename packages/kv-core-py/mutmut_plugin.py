"""Loaded by ``nox -s mutate`` (``-p mutmut_plugin``): mutmut's call-stack record, kept in a
thread-local instead of a ContextVar (see docs/mutation.md)."""

from __future__ import annotations

import threading
from typing import Any


class _ThreadLocalVar(threading.local):
    value: tuple[str | None, int] = (None, 0)

    def get(self) -> tuple[str | None, int]:
        return self.value

    def set(self, value: tuple[str | None, int]) -> tuple[str | None, int]:
        previous, self.value = self.value, value
        return previous

    def reset(self, token: tuple[str | None, int]) -> None:
        self.value = token


def _install() -> None:
    try:
        from mutmut.core import MutmutCallStack  # type: ignore[import-not-found, unused-ignore]
    except ImportError:  # not under mutmut
        return
    stack: Any = MutmutCallStack
    if not isinstance(stack._ctx, _ThreadLocalVar):
        stack._ctx = _ThreadLocalVar()


_install()
