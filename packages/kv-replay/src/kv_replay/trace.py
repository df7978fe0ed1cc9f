"""Request traces: Mooncake JSONL (hash ids of 512-token blocks) and kvcore JSONL (explicit
token ids), plain or gzip-compressed, and the traces that ship inside this package. See
docs/replay.md for both formats."""

from __future__ import annotations

import codecs
import gzip
import io
import itertools
import json
import math
import sys
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from kv_api import ReuseScope
from kv_api.keys import cache_salt_to_id
from kv_replay.plural import plural
from kv_replay.request import Request, TableRows
from kv_replay.synthetic import synthetic_runs, synthetic_tokens

__all__ = ["BUILTIN_TRACES", "MAX_TOKENS", "MOONCAKE_BLOCK", "Request", "TraceError", "load_trace", "synthetic_tokens"]

MOONCAKE_BLOCK = 512
#: The longest prompt or output a trace may ask for, in tokens (2**24).
MAX_TOKENS = 1 << 24
#: Traces shipped inside the package, by name (see traces/README.md there).
BUILTIN_TRACES = {"mooncake-synthetic": "mooncake-synthetic.jsonl.gz"}


_EMPTY = np.zeros(0, dtype=np.int32)


class TraceError(ValueError):
    """A malformed trace line; the message names the file and the line."""


class _Expansion:
    """The tokens a trace's lines name but do not list, made after the last line is parsed, in
    two vectorised passes: each distinct Mooncake hash id's 512-token block once (a prompt is a
    slice of that table where its blocks are consecutive rows, else those rows, gathered when
    its tokens are asked for), and every generated output."""

    def __init__(self) -> None:
        self.rows: dict[int, int] = {}
        self.prompts: list[tuple[Request, list[int], int]] = []
        self.outputs: list[tuple[Request, int, int]] = []

    def prompt(self, request: Request, hash_ids: list[int], length: int) -> None:
        # Only the blocks the cut keeps: a line may list far more ids than its length needs.
        needed = hash_ids[: -(-length // MOONCAKE_BLOCK)]
        rows = self.rows
        self.prompts.append((request, [rows.setdefault(h, len(rows)) for h in needed], length))

    def output(self, request: Request, index: int, length: int) -> None:
        self.outputs.append((request, index, length))

    def finish(self) -> None:
        table = synthetic_runs(
            np.fromiter(self.rows, dtype=np.uint64, count=len(self.rows)),
            np.full(len(self.rows), MOONCAKE_BLOCK, dtype=np.int64),
            stream=1,
        ).reshape(-1, MOONCAKE_BLOCK)
        for request, rows, length in self.prompts:
            first = rows[0]
            if rows == list(range(first, first + len(rows))):  # consecutive rows: a view
                request.prompt = table.reshape(-1)[first * MOONCAKE_BLOCK : first * MOONCAKE_BLOCK + length]
            else:  # gathered when asked for (kv_replay.request)
                request.prompt = TableRows(table, np.array(rows, dtype=np.int64), length)
        if not self.outputs:
            return
        lengths = np.fromiter((n for _, _, n in self.outputs), dtype=np.int64, count=len(self.outputs))
        seeds = np.fromiter((i for _, i, _ in self.outputs), dtype=np.uint64, count=len(self.outputs))
        tokens = synthetic_runs(seeds, lengths, stream=2)
        for (request, _, _), output in zip(self.outputs, np.split(tokens, np.cumsum(lengths)[:-1]), strict=True):
            request.output = output


def _int(where: str, record: dict[str, Any], key: str, low: int = 0, high: int = MAX_TOKENS) -> int:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise TraceError(f"{where}: field {key!r}: must be an integer in [{low}, {high:,}] (got {_show(value)})")
    return value


def _block_ids(values: list[Any]) -> bool:
    """Whether every item is an integer (not a bool) in [0, 2**64): one pass in C for the types,
    one each for the bounds (a per-item check was a tenth of a long trace's load)."""
    if not values:
        return True
    if not set(map(type, values)) <= {int}:
        return all(isinstance(h, int) and not isinstance(h, bool) and 0 <= h < 2**64 for h in values)
    return bool(min(values) >= 0 and max(values) < 2**64)


def _show(value: Any) -> str:
    """A value as the user wrote it, cut short."""
    try:
        text = json.dumps(value)
    except (RecursionError, ValueError):  # nested deeper than the encoder goes, a lone surrogate
        text = "[...]" if isinstance(value, list) else "{...}" if isinstance(value, dict) else "..."
    return text if len(text) <= 40 else text[:37] + "..."


def _text(where: str, record: dict[str, Any], key: str) -> str | None:
    """An optional string field, which must encode to UTF-8 (a JSON ``\\udcff`` escape does not)."""
    value = record.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise TraceError(f"{where}: field {key!r}: must be a string (got {_show(value)})")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise TraceError(f"{where}: field {key!r}: not Unicode text (it has a lone surrogate escape)") from None
    return value


def _arrival(where: str, record: dict[str, Any], index: int) -> float:
    """``timestamp`` (default: the line's index) as a finite float."""
    value = record.get("timestamp", index)
    arrival = math.nan
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            arrival = float(value)
        except OverflowError:  # an integer beyond any float
            pass
    if not math.isfinite(arrival):
        raise TraceError(f"{where}: field 'timestamp': must be a finite number (got {_show(value)})")
    return arrival


def _tokens(where: str, record: dict[str, Any], key: str) -> np.ndarray[Any, np.dtype[np.int32]]:
    value = record.get(key)
    if not isinstance(value, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**31 for t in value
    ):
        raise TraceError(f"{where}: field {key!r}: must be a list of token ids in [0, 2**31)")
    if len(value) > MAX_TOKENS:
        raise TraceError(f"{where}: field {key!r}: at most {MAX_TOKENS:,} tokens (got {len(value):,})")
    return np.asarray(value, dtype=np.int32)


def _scope(where: str, record: dict[str, Any]) -> ReuseScope | None:
    salt = _text(where, record, "cache_salt")
    lora = record.get("lora_id")
    if salt is None and lora is None:
        return None
    if lora is not None and (isinstance(lora, bool) or not isinstance(lora, int) or not 0 <= lora < 2**64):
        raise TraceError(f"{where}: field 'lora_id': must be an unsigned 64-bit integer (got {_show(lora)})")
    return ReuseScope(lora, cache_salt_to_id(salt) if salt is not None else None)


def _seconds(record: dict[str, Any], arrival: float, unit: float) -> float | None:
    """The arrival (``_arrival``'s) in seconds where the line has a ``timestamp``, else None:
    Mooncake's are milliseconds, kvcore's seconds."""
    return arrival * unit if "timestamp" in record else None


def parse_record(where: str, record: Any, index: int, expansion: _Expansion) -> Request:
    """One trace line's object as a request (Mooncake if it has ``hash_ids``, else kvcore), whose
    generated tokens ``expansion`` makes later."""
    if not isinstance(record, dict):
        raise TraceError(f"{where}: expected a JSON object")
    arrival = _arrival(where, record, index)
    scope = _scope(where, record)
    if "hash_ids" in record:
        hash_ids = record["hash_ids"]
        if not isinstance(hash_ids, list) or not _block_ids(hash_ids):
            raise TraceError(f"{where}: field 'hash_ids': must be a list of integers in [0, 2**64)")
        length = _int(where, record, "input_length", 1)
        if length > MOONCAKE_BLOCK * len(hash_ids):
            tokens = plural(length, "token") + (" exceeds" if length == 1 else " exceed")
            raise TraceError(
                f"{where}: field 'input_length': {tokens} its {plural(len(hash_ids), 'block')} "
                f"('hash_ids') of {MOONCAKE_BLOCK} tokens"
            )
        request = Request(_EMPTY, _EMPTY, scope, arrival, f"request {index}", _seconds(record, arrival, 1e-3))
        expansion.prompt(request, hash_ids, length)
        expansion.output(request, index, _int(where, record, "output_length"))
        return request
    if "tokens" not in record:
        raise TraceError(f"{where}: expected a field 'hash_ids' (Mooncake) or 'tokens' (kvcore)")
    prompt = _tokens(where, record, "tokens")
    if len(prompt) == 0:
        raise TraceError(f"{where}: field 'tokens': must not be empty")
    listed = "output" in record
    output = _tokens(where, record, "output") if listed else _EMPTY
    generated = 0 if listed else _int(where, record, "output_length")
    name = record.get("name")
    if not (isinstance(name, (int, float)) and not isinstance(name, bool)):  # a number labels too
        name = _text(where, record, "name")
    request = Request(prompt, output, scope, arrival, f"request {index}" if name is None else str(name))
    request.seconds = _seconds(record, arrival, 1.0)
    if not listed:
        expansion.output(request, index, generated)
    return request


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON number")


def _numbered(f: Iterable[bytes], name: str) -> Iterator[tuple[str, bytes]]:
    """``(FILE:LINE, bytes)`` of every line; a file that cannot be read (a corrupt or truncated
    gzip stream, an I/O error) is a ``TraceError`` naming the line it was reading."""
    lines = iter(f)
    for number in itertools.count(1):
        where = f"{name}:{number}"
        try:
            raw = next(lines)
        except StopIteration:
            return
        except (OSError, EOFError) as exc:
            raise TraceError(f"{where}: cannot read: {exc}") from None
        except zlib.error as exc:
            raise TraceError(f"{where}: cannot read: corrupt gzip data ({exc})") from None
        # A byte order mark some editors write first: not part of the JSON.
        yield where, raw.removeprefix(codecs.BOM_UTF8) if number == 1 else raw


def _lines(f: Iterable[bytes], name: str, limit: int | None) -> Iterator[tuple[str, str]]:
    """``(FILE:LINE, text)`` of the first ``limit`` non-blank lines (all without a limit)."""
    numbered = ((where, raw) for where, raw in _numbered(f, name) if raw.strip())
    for where, raw in itertools.islice(numbered, limit):
        try:
            yield where, raw.decode("utf-8")
        except UnicodeDecodeError:
            raise TraceError(f"{where}: not UTF-8 text (expected one JSON object per line)") from None


def _parse(where: str, line: str) -> Any:
    """One line's JSON value; ``TraceError`` for anything that is not plain JSON."""
    try:
        return json.loads(line, parse_constant=_not_json)
    except RecursionError:
        raise TraceError(f"{where}: not valid JSON (nested too deeply)") from None
    except ValueError as exc:  # JSONDecodeError, NaN, or an integer too long to parse
        if isinstance(exc, json.JSONDecodeError):
            message = "a byte order mark (U+FEFF) past the first line" if "BOM" in exc.msg else exc.msg
        elif str(exc).startswith("Exceeds the limit"):  # Python's cap on integer digits
            message = f"an integer of more than {sys.get_int_max_str_digits():,} digits"
        else:
            message = str(exc)
        raise TraceError(f"{where}: not valid JSON ({message})") from None


@contextmanager
def _open(path: str | Path) -> Iterator[tuple[Iterable[bytes], str]]:
    """A trace file (gzip-compressed if its name ends in .gz), or a built-in trace by name."""
    name = str(path)
    if name in BUILTIN_TRACES and not Path(name).exists():
        packed = (resources.files("kv_replay") / "traces" / BUILTIN_TRACES[name]).read_bytes()
        yield gzip.GzipFile(fileobj=io.BytesIO(packed)), name
        return
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        builtin = ", ".join(BUILTIN_TRACES)
        raise TraceError(
            f"{name or repr(name)}: No such file or directory, nor a built-in trace (built-in traces: {builtin})"
        ) from None
    with f:
        yield (gzip.GzipFile(fileobj=f) if name.endswith(".gz") else f), name


def load_trace(path: str | Path, limit: int | None = None) -> list[Request]:
    """The requests of a JSONL trace (the first ``limit`` lines' only, read no further), in
    arrival order (stable); ``TraceError`` names the file and line of the first malformed one,
    before anything runs."""
    requests: list[Request] = []
    expansion = _Expansion()
    with _open(path) as (f, name):
        for where, line in _lines(f, name, limit):
            requests.append(parse_record(where, _parse(where, line), len(requests), expansion))
    if not requests:
        raise TraceError(f"{name}: no requests")
    expansion.finish()
    requests.sort(key=lambda r: r.arrival)
    return requests
