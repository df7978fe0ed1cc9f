"""A replay's progress bar on stderr: requests done, their rate and the time left (tqdm).

It is drawn only when stderr is a terminal or when asked (``--progress``), so that pipes, logs
and tests read no carriage returns; ``--quiet`` turns it off. A bar that is not drawn gives the
replayer no callback at all, so it costs nothing per step; tqdm is imported only for a bar that
is drawn.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from types import TracebackType
from typing import Any, TextIO

__all__ = ["ProgressBar"]


class ProgressBar:
    """``callback`` is what the replayer calls with ``(done, total)``, or None when the bar is not
    shown; the bar is drawn from its first call. Leaving the ``with`` block ends the bar's line
    (after Ctrl-C too, so the message that follows starts a line of its own)."""

    def __init__(self, label: str, *, quiet: bool = False, forced: bool = False, stream: TextIO | None = None) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.shown = not quiet and (forced or _is_terminal(self.stream))
        self._bar: Any = None  # a tqdm, once the total is known

    @property
    def callback(self) -> Callable[[int, int], None] | None:
        return self._update if self.shown else None

    def _update(self, done: int, total: int) -> None:
        if self._bar is None:
            from tqdm import tqdm

            # A terminal that reports no size (a fresh pty) would get no bar at all: assume 80x24.
            unsized = _columns(self.stream) == 0
            self._bar = tqdm(
                total=total,
                desc=self.label,
                unit=" requests",
                file=self.stream,
                dynamic_ncols=not unsized,
                ncols=80 if unsized else None,
                nrows=24 if unsized else None,
                mininterval=0.1,  # a replay steps up to ~100k times a second: redraw 10 times at most
                smoothing=0.1,  # the rate of recent requests, for the time left
            )
        self._bar.update(done - self._bar.n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _columns(stream: TextIO) -> int | None:
    """The terminal's width, None for a stream that is not one."""
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError):  # not a terminal, no file descriptor (io.UnsupportedOperation), closed
        return None


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except ValueError:  # closed
        return False
