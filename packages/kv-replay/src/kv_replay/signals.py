"""SIGTERM during ``kvcore replay``: handled as Ctrl-C (SIGINT), so that a terminated replay
cleans up as an interrupted one does (temporary directory, managers and their disk files,
publishers); it then prints ``kvcore: terminated`` and exits with status 143 (128 + SIGTERM),
where Ctrl-C prints ``kvcore: interrupted`` and exits with 130."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised wherever the replay is, so it unwinds as Ctrl-C does."""


def _terminated(signum: int, frame: object) -> None:
    raise Terminated


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises ``Terminated`` (a ``KeyboardInterrupt``) as SIGINT does; the previous
    handler is restored after it (``kvcore`` used as a library keeps its own). A SIGTERM the
    process was started ignoring stays ignored, as Python leaves an ignored SIGINT; off the main
    thread, where no handler can be set, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_IGN or previous is None:  # None: set outside Python, cannot be restored
        yield
        return
    signal.signal(signal.SIGTERM, _terminated)  # as SIGINT's handler, with its own class
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
