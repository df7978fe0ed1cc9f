"""``kvcore events --subscribe tcp://HOST:PORT``: the wire's events, one line each, as they come.

Each line is ``seq N: EVENT field=value ...`` (``--json``: one JSON object per line, with ``seq``,
``ts``, ``rank``, ``type`` and the event's fields); ``--replay`` names the publisher's replay socket
so gaps are fetched (a gap it cannot fill is reported on stderr); ``--count N`` stops after N
events. It first says on stderr that it waits, and for which endpoint. Ctrl-C ends it quietly.
"""

from __future__ import annotations

import argparse
import json
import sys


class EventsError(Exception):
    """A bad ``--subscribe`` or ``--replay``: the message names it."""


def _fields(event: object) -> dict[str, object]:
    return {f: getattr(event, f) for f in getattr(event, "__struct_fields__", ())}


def _batches(gap: tuple[int, int]) -> str:
    first, last = gap
    return f"batch {first}" if first == last else f"batches {first}..{last}"


def events(args: argparse.Namespace) -> int:
    try:
        from kv_events import EventSubscriber
    except ImportError:
        raise EventsError("--subscribe: kv_events is not installed (pip install ./packages/kv-events)") from None
    try:
        subscriber = EventSubscriber(args.subscribe, replay_endpoint=args.replay)
    except (ValueError, OSError) as exc:
        flag = "--replay" if args.replay and args.replay in str(exc) else "--subscribe"
        raise EventsError(f"{flag}: {exc}") from None
    printed = 0
    reported = 0
    with subscriber:  # at once: a Ctrl-C with its sockets open would hang the exit (ZeroMQ's linger)
        replay = f" (replay socket {args.replay})" if args.replay else ""
        # ZeroMQ connects lazily, and silently: say what this waits for, and where, before any event.
        print(f"kvcore: waiting for events from {args.subscribe}{replay}; Ctrl-C to stop", file=sys.stderr, flush=True)
        while args.count is None or printed < args.count:
            got = subscriber.receive()
            if got is None:
                continue
            seq, batch = got
            for gap in subscriber.missed[reported:]:
                print(f"kvcore: missed {_batches(gap)}", file=sys.stderr)
            reported = len(subscriber.missed)
            for event in batch.events:
                fields = _fields(event)
                name = type(event).__name__
                if args.json:
                    line = {"seq": seq, "ts": batch.ts, "rank": batch.data_parallel_rank, "type": name, **fields}
                    print(json.dumps(line))
                else:
                    print(f"seq {seq}: {name} " + " ".join(f"{k}={v}" for k, v in fields.items()))
                printed += 1
                if args.count is not None and printed >= args.count:
                    break
            sys.stdout.flush()
    return 0
