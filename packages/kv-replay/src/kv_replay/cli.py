"""The ``kvcore`` command: ``kvcore replay`` (the main job), ``kvcore engine`` (real forwards,
``kv_replay.engine_command``), ``kvcore events`` and ``kvcore backends``.

Every error is one line on stderr, ``kvcore: error: WHAT: why``, where WHAT is what the user
typed (a flag, ``FILE:LINE``, an environment variable), and exits with status 2; nothing is
replayed after a bad flag or line. A closed stdout (``| head``) ends the command quietly.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import fields
from importlib import metadata
from typing import Any, NoReturn

import kv_api
from kv_api.errors import BackendError
from kv_replay.engine_flags import EngineError, add_parser
from kv_replay.events_command import EventsError, events
from kv_replay.flag_types import disk_path_flag, integer, metrics_port_flag, progress_flags, quotas, remote_flag, size
from kv_replay.model import MAX_LAYERS, Layers, ModelError
from kv_replay.options import OptionError, ReplayOptions
from kv_replay.plot import PlotError
from kv_replay.publish import PublishError, endpoint
from kv_replay.replay_command import replay
from kv_replay.routers import ROUTERS
from kv_replay.signals import Terminated, terminate_as_interrupt
from kv_replay.sizes import parse_size
from kv_replay.trace import BUILTIN_TRACES, MAX_TOKENS, TraceError


class UsageError(Exception):
    """A bad flag or argument: the message names it."""


class _Parser(argparse.ArgumentParser):
    """argparse, but its errors are one line, naming the flag (no usage dump)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # A word starting with "-" and a digit is a value, not a flag (as from Python 3.13):
        # "--quota -1G" is a negative size, not "--quota: expected one argument".
        self._negative_number_matcher = re.compile(r"^-\.?\d")

    def error(self, message: str) -> NoReturn:
        # "argument --progress: not allowed with argument --quiet" as the other errors read.
        raise UsageError(message.removeprefix("argument ").replace("not allowed with argument ", "not with "))


def error(message: str) -> None:
    """One line on stderr, whatever the message."""
    print(f"kvcore: error: {'; '.join(message.splitlines())}", file=sys.stderr)


def routers(text: str) -> list[str]:
    """``--router``: one router, or a comma-separated list of them to compare."""
    names = [part.strip() for part in text.split(",")]
    for name in names:
        if name not in ROUTERS:
            raise argparse.ArgumentTypeError(f"unknown router {name[:40]!r} (choose from {', '.join(ROUTERS)})")
    return list(dict.fromkeys(names))


def layers(text: str) -> Layers:
    """``--layers``: parsed, and so checked, once."""
    try:
        return Layers.parse(text)
    except ModelError as exc:
        raise argparse.ArgumentTypeError(exc.why) from None


class _Version(argparse.Action):
    """``--version``: the command's, the contract's and each loadable backend's versions; the
    backends are loaded only when asked for."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the versions and exit")

    def __call__(self, p: argparse.ArgumentParser, *_: object) -> None:
        found = ", ".join(f"{n} {kv_api.load_backend(n).version}" for n in kv_api.available_backends())
        print(
            f"kvcore {metadata.version('kv-replay')} (kv-api {metadata.version('kv-api')}; backends: {found or 'none'})"
        )
        p.exit()


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="kvcore", description="kvcore: a KV-cache manager for LLM inference")
    p.add_argument("--version", action=_Version)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _replay_parser(sub)
    add_parser(sub)
    _events_parser(sub)
    sub.add_parser(
        "backends", help="list installed backends and their build info", description="List installed backends."
    )
    return p


def _replay_parser(sub: argparse._SubParsersAction[_Parser]) -> None:
    r = sub.add_parser(
        "replay",
        help="replay a workload through the manager and report reuse, memory and latency",
        description="Replay a workload through the KV-cache manager as an inference engine drives it, and report "
        "hit rate, evictions, pool utilisation, memory and latency (docs/replay.md).",
    )
    r.add_argument(
        "trace",
        nargs="?",
        metavar="TRACE",
        help="a Mooncake or kvcore JSONL trace (.gz too), or a built-in one: "
        f"{', '.join(BUILTIN_TRACES)} (default: the embedded workload of chats and documents)",
    )
    r.add_argument(
        "--backend", help="the backend to replay on (default: $KV_BACKEND, else the highest-priority installed one)"
    )
    _model_flags(r)
    _run_flags(r)
    _output_flags(r)


def _model_flags(r: argparse.ArgumentParser) -> None:
    """The model and its memory: block size, quotas, tiers, layers."""
    r.add_argument(
        "--tokens-per-block", type=integer(1, 4096), default=32, metavar="N", help="block size (default: 32)"
    )
    r.add_argument(
        "--quota",
        type=quotas,
        default=[parse_size("128M")],
        metavar="SIZE[,SIZE...]",
        help="device quota, e.g. 128M, 1G, 512MiB; a comma-separated list replays once per quota and prints "
        "the capacity curve (default: 128M)",
    )
    r.add_argument(
        "--host-quota",
        type=quotas,
        metavar="SIZE[,SIZE...]",
        help="add a host-memory tier below the device: pages evicted from the device move there and come back "
        "when reused; a comma-separated list is a capacity sweep over it (default: none, no host tier)",
    )
    r.add_argument(
        "--disk-quota",
        type=size,
        metavar="SIZE",
        help="add a disk tier, the coldest level, of this size (default: none, no disk tier)",
    )
    disk_path_flag(r)
    remote_flag(r)
    r.add_argument(
        "--layers",
        type=layers,
        default="4",
        metavar="SPEC",
        help="groups of COUNT[xWINDOW][+SINKS] or COUNTssm, comma-separated: e.g. 24,8x4096+4,2ssm is 24 "
        "full-attention layers, 8 sliding-window layers (window 4096, 4 sink tokens) and 2 state-space (SSM) "
        f"layers; at most {MAX_LAYERS} layers (default: 4)",
    )
    r.add_argument(
        "--bytes-per-token",
        type=integer(1, 1 << 20),
        default=256,
        metavar="N",
        help="bytes of K, and of V, per token and layer (default: 256)",
    )


def _run_flags(r: argparse.ArgumentParser) -> None:
    """How the workload runs: in flight, seed, limit, instances."""
    r.add_argument(
        "--max-in-flight", type=integer(1, 1 << 16), default=16, metavar="N", help="requests run at once (default: 16)"
    )
    r.add_argument(
        "--seed", type=integer(0, 2**64 - 1), default=0, metavar="N", help="seed of the embedded workload (default: 0)"
    )
    r.add_argument(
        "--limit",
        type=integer(1, MAX_TOKENS),
        metavar="N",
        help="replay only the first N requests of the trace; the rest is not read (default: all)",
    )
    r.add_argument(
        "--instances",
        type=integer(1, 64),
        default=1,
        metavar="N",
        help="replay on N engine instances (one manager each, the same config), each request on the one "
        "--router picks (default: 1)",
    )
    r.add_argument(
        "--router",
        type=routers,
        metavar="NAME[,NAME...]",
        help=f"how requests are spread over --instances: {', '.join(ROUTERS)} (kv: every instance's "
        "probe_reuse; dynamo: NVIDIA Dynamo's KV indexer fed the instances' events); a list compares them "
        "(default: round-robin when --instances > 1)",
    )
    r.add_argument("--no-partial-reuse", action="store_true", help="reuse whole blocks only (default: partial too)")


def _output_flags(r: argparse.ArgumentParser) -> None:
    """What comes out: the report, the plot, the comparison, the events, the progress bar."""
    r.add_argument("--json", action="store_true", help="print the summary as JSON (schema: docs/replay.md)")
    r.add_argument(
        "--plot",
        metavar="FILE.png",
        help="draw hit rate and pool utilisation per engine step, or with a --quota list or --quota-curve the "
        "capacity curve (needs matplotlib; checked before the replay starts) (default: none)",
    )
    r.add_argument(
        "--quota-curve",
        action="store_true",
        help="estimate the hit rate at every device quota from one replay at an unbounded quota (stack "
        "distances): rows at powers of two and at the --quota values, without a replay per quota "
        "(full-attention layers; docs/replay.md) (default: off)",
    )
    r.add_argument("--compare", action="store_true", help="replay on every installed backend; exit 1 if reuse differs")
    r.add_argument(
        "--publish",
        type=endpoint,
        metavar="tcp://HOST:PORT",
        help="publish the replay's KV-cache events there as it runs (vLLM's ZeroMQ format, docs/events.md; "
        "watch with kvcore events --subscribe); port * picks a free one (default: none)",
    )
    r.add_argument(
        "--wait-subscribers",
        type=integer(0, 1 << 16),
        default=0,
        metavar="N",
        help="with --publish, start the replay only once N subscribers listen (default: 0, start at once)",
    )
    metrics_port_flag(r, "replay")
    progress_flags(r)


def _events_parser(sub: argparse._SubParsersAction[_Parser]) -> None:
    e = sub.add_parser(
        "events",
        help="print the KV-cache events a publisher sends (docs/events.md)",
        description="Subscribe to a kvcore (or vLLM) KV-event publisher and print one line per event.",
    )
    e.add_argument("--subscribe", required=True, metavar="tcp://HOST:PORT", help="the publisher's endpoint")
    e.add_argument("--replay", metavar="tcp://HOST:PORT", help="its replay socket, to fetch missed batches")
    e.add_argument("--json", action="store_true", help="one JSON object per event")
    e.add_argument("--count", type=integer(1, 2**62), metavar="N", help="stop after N events (default: never)")


def _default_chosen_by() -> str:
    return "KV_BACKEND" if os.environ.get("KV_BACKEND", "").strip() else "default backend"


def chosen_backends(name: str | None, compare: bool = False) -> list[kv_api.Backend]:
    """The backends to replay on (``--backend``, or with ``--compare`` every installed one),
    loaded before anything runs; errors name ``--backend`` or ``KV_BACKEND``, whichever chose."""
    if compare:
        return [kv_api.load_backend(n) for n in kv_api.available_backends()]
    try:
        return [kv_api.load_backend(name)]  # None: the default backend
    except BackendError as exc:
        raise UsageError(f"{'--backend' if name is not None else _default_chosen_by()}: {exc}") from None


def backends() -> int:
    """Print the default backend, then every installed backend (highest priority first) with its
    version, priority, build info and capabilities; status 2 if the default backend does not
    load, 1 if an installed one fails to load."""
    status = 0
    try:
        print(f"default backend: {kv_api.load_backend().name}")
    except BackendError as exc:
        error(f"{_default_chosen_by()}: {exc}")
        status = 2
    loadable = kv_api.available_backends()
    for name in loadable:
        b = kv_api.load_backend(name)
        print(f"{name} {b.version} (priority {b.priority})")
        for key, value in b.build_info().items():
            print(f"  {key}: {value}")
        caps = ", ".join(f"{f.name}={getattr(b.capabilities, f.name)}" for f in fields(b.capabilities))
        print(f"  capabilities: {caps}")
    for name in kv_api.installed_backends():
        if name not in loadable:
            try:
                kv_api.load_backend(name)
            except BackendError as exc:
                print(f"{name}: failed to load\n  {exc}")
                status = status or 1
    return status


def main(argv: list[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
        if args.command == "backends":
            return backends()
        if args.command == "events":
            return events(args)
        if args.command == "engine":
            with terminate_as_interrupt():
                from kv_replay.engine_command import engine  # only here: the replay does not need it

                (backend,) = chosen_backends(args.backend)
                return engine(args, backend)
        options = ReplayOptions.from_flags(args)  # the flags' values checked together
        with terminate_as_interrupt():  # SIGTERM cleans up as Ctrl-C does, below
            return replay(options, chosen_backends(options.backend, options.compare))
    except (UsageError, TraceError, PlotError, OptionError, EventsError, PublishError, EngineError) as exc:
        message = str(exc)
    except BrokenPipeError:
        raise
    except OSError as exc:  # the trace cannot be opened or read
        message = f"{exc.filename}: {exc.strerror}" if exc.filename else str(exc)
    except Terminated:  # SIGTERM during a replay, cleaned up as Ctrl-C is
        print("kvcore: terminated", file=sys.stderr)
        return 143
    except KeyboardInterrupt:  # Ctrl-C
        print("kvcore: interrupted", file=sys.stderr)
        return 130
    error(message)
    return 2


def entry() -> None:
    """The console script: a closed stdout ends the command quietly, like other Unix tools."""
    try:
        status = main()
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        status = 141  # 128 + SIGPIPE, as a tool killed by the signal
    sys.exit(status)


if __name__ == "__main__":
    entry()
