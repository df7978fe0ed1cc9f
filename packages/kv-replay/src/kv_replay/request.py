"""A replayed request, and a prompt kept as rows of a table until it is asked for.

A Mooncake trace names each prompt's 512-token blocks by hash id, and the trace's expansion
makes each distinct block once, as a row of one table (kv_replay.trace). A prompt whose blocks
are consecutive rows is a view of the table; any other was gathered into an array of its own
when the trace was loaded: on the shipped trace 245 MB of fresh memory, all of it resident for
the whole run. Now such a prompt is gathered each time its tokens are asked for
(``Request.prompt``): a replay asks once per admission (again after a preemption), so only the
running requests' prompts are in memory, in malloc's memory reused from one to the next.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from kv_api import ReuseScope

__all__ = ["I32", "Request", "TableRows"]

I32 = np.ndarray[Any, np.dtype[np.int32]]


class TableRows:
    """The first ``length`` tokens of ``rows`` of ``table`` (2-D, one block per row), in order."""

    __slots__ = ("length", "rows", "table")

    def __init__(self, table: I32, rows: np.ndarray[Any, np.dtype[np.int64]], length: int) -> None:
        self.table, self.rows, self.length = table, rows, length

    def tokens(self) -> I32:
        """A fresh array ("clip": the rows are valid, and a take that checks them buffers its output)."""
        gathered: I32 = np.take(self.table, self.rows, axis=0, mode="clip")
        return gathered.reshape(-1)[: self.length]

    def head(self, n: int) -> I32:
        """The first ``min(n, length)`` tokens, gathering only the rows they lie in."""
        n = min(n, self.length)
        width = self.table.shape[1]
        if n <= width:
            return self.table[int(self.rows[0]), :n]
        return TableRows(self.table, self.rows[: -(-n // width)], n).tokens()


class Request:
    """One request: its prompt, the tokens the "model" answers, and its reuse scope.

    ``prompt`` is an array, or rows of a trace's table (``TableRows``), gathered afresh on every
    read: ``prompt_length`` and ``prompt_head`` answer without gathering.
    """

    __slots__ = ("_prompt", "arrival", "name", "output", "prompt_length", "scope", "seconds")

    def __init__(
        self,
        prompt: I32 | TableRows,
        output: I32,
        scope: ReuseScope | None = None,
        arrival: float = 0.0,
        name: str = "",
        seconds: float | None = None,  # the arrival in seconds, where the trace gives a timestamp
    ) -> None:
        self.prompt = prompt
        self.output, self.scope, self.arrival, self.name, self.seconds = output, scope, arrival, name, seconds

    @property
    def prompt(self) -> I32:
        source = self._prompt
        return source.tokens() if isinstance(source, TableRows) else source

    @prompt.setter
    def prompt(self, value: I32 | TableRows) -> None:
        self._prompt = value
        self.prompt_length = value.length if isinstance(value, TableRows) else len(value)

    def prompt_head(self, n: int) -> I32:
        """The prompt's first ``n`` tokens (all of a shorter one)."""
        source = self._prompt
        return source.head(n) if isinstance(source, TableRows) else source[:n]

    def __repr__(self) -> str:
        return f"Request({self.name!r}, {self.prompt_length} prompt tokens, {len(self.output)} output tokens)"
