"""argparse types and flag groups shared by ``kvcore``'s commands (``cli``, ``engine_command``):
each value is checked once, and a bad one is an ``argparse.ArgumentTypeError`` the parser turns
into one line naming the flag."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

import kv_api
from kv_replay.sizes import parse_size

QUOTA_LIMIT = kv_api.config.QUOTA_LIMIT


def integer(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer in ``[low, high]``."""

    def convert(text: str) -> int:
        try:
            value = int(text.strip()) if len(text) <= 40 else None
        except ValueError:
            value = None
        if value is None:
            raise argparse.ArgumentTypeError(f"expected an integer (got {text[:40]!r})")
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be in [{low:,}, {high:,}] (got {value:,})")
        return value

    return convert


def quotas(text: str) -> list[int]:
    """``--quota``: one size, or a comma-separated list of them for a capacity sweep."""
    sizes = []
    for part in text.split(","):
        if part.strip().startswith("-") and _is_size(part.strip()[1:]):
            raise argparse.ArgumentTypeError(f"{part.strip()[:40]!r}: a size cannot be negative")
        try:
            size = parse_size(part)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if not 0 < size < QUOTA_LIMIT:
            raise argparse.ArgumentTypeError(f"{part.strip()!r} must be at least 1 byte and below 2**63 bytes")
        sizes.append(size)
    return sorted(set(sizes))


def _is_size(text: str) -> bool:
    try:
        parse_size(text)
    except ValueError:
        return False
    return True


def size(text: str) -> int:
    """``kvcore replay --disk-quota``: one size, validated like ``--quota``."""
    return _one_size(text, "; a sweep varies --quota or --host-quota")


def one_size(text: str) -> int:
    """``kvcore engine``'s quota flags: one size, validated like ``kvcore replay --quota``."""
    return _one_size(text, "")


def _one_size(text: str, hint: str) -> int:
    if "," in text:
        raise argparse.ArgumentTypeError(f"one size, not a list (got {text[:40]!r}{hint})")
    (value,) = quotas(text)
    return value


def directory(text: str) -> str:
    """``--disk-path``: an existing directory this process can write in."""
    if not os.path.exists(text):
        raise argparse.ArgumentTypeError(f"directory {text} does not exist")
    if not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text} is not a directory")
    if not os.access(text, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"directory {text} is not writable")
    return text


def disk_path_flag(parser: argparse.ArgumentParser) -> None:
    """``--disk-path``, as every command with a disk tier takes it."""
    parser.add_argument(
        "--disk-path",
        type=directory,
        metavar="DIR",
        help="an existing directory for the disk tier's files (default: a temporary directory, removed after the run)",
    )


def remote(text: str) -> str:
    """``--remote``: ``redis://`` or ``rediss://`` URL, ``valkey`` (an embedded server) or ``file:DIR``."""
    spec = text.strip()
    if spec == "valkey" or (spec.startswith(("redis://", "rediss://")) and len(spec.split("://", 1)[1]) > 0):
        return spec
    if spec.startswith("file:") and spec[len("file:") :]:
        return spec
    raise argparse.ArgumentTypeError(
        f"expected redis://HOST:PORT, rediss://HOST:PORT, valkey or file:DIR (got {text[:40]!r})"
    )


def remote_flag(parser: argparse.ArgumentParser) -> None:
    """``--remote``, as every command with a remote tier takes it."""
    parser.add_argument(
        "--remote",
        type=remote,
        metavar="STORE",
        help="add a remote tier below the local ones, shared by every manager of the run (--instances): "
        "redis://[USER:PASSWORD@]HOST:PORT or rediss:// (a Valkey/Redis server), valkey (start an embedded "
        "valkey-server for the run) or file:DIR (a directory kept across runs) (default: none; docs/store.md)",
    )


def progress_flags(parser: argparse.ArgumentParser) -> None:
    """``--quiet`` / ``--progress``: whether the progress bar is drawn."""
    bar = parser.add_mutually_exclusive_group()
    bar.add_argument("--quiet", action="store_true", help="no progress bar (default: a bar when stderr is a terminal)")
    bar.add_argument(
        "--progress",
        action="store_true",
        help="draw the progress bar on stderr even when it is not a terminal (default: only on a terminal)",
    )


def metrics_port_flag(p: argparse.ArgumentParser, runs: str) -> None:
    """``--metrics-port N`` of ``kvcore replay`` and ``kvcore engine`` (``runs``: what it serves during)."""
    p.add_argument(
        "--metrics-port",
        type=integer(0, 65535),
        metavar="N",
        help="serve the managers' statistics as Prometheus metrics on http://127.0.0.1:N/metrics while the "
        f"{runs} runs (vLLM's names where vLLM has one; 0 picks a free port, printed on stderr; docs/metrics.md) "
        "(default: none)",
    )
