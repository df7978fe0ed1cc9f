"""``kvcore replay --publish ENDPOINT``: the replay's KV-cache events on the wire as it runs, in
vLLM's ZeroMQ format (``kv_events``; docs/events.md), for ``kvcore events --subscribe`` or a
KV-aware router to watch.

The endpoint is checked with the flags, before anything runs; it is bound before the manager is
built, so the stream starts with the manager's ``AllBlocksCleared``. ZeroMQ drops what is sent
before a subscriber's subscription arrives: ``--wait-subscribers N`` holds the replay until N
have subscribed. The replayer flushes the iteration's events every engine step, as an engine
does; closing the publisher after the manager's shutdown sends what is left, the emptied tree
included.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from kv_api import Backend, KVCacheEventManager, KVCacheManagerConfig
from kv_replay.plural import plural

__all__ = ["EVENT_ENTRIES", "PublishError", "endpoint", "publishing"]

#: The event manager's ring: room for the events of ~10 ms of the fastest replay between the
#: publisher's drains (one that would overflow publishes a resync: nothing is lost silently).
EVENT_ENTRIES = 1 << 20
_MISSING = "kv_events is not installed (pip install ./packages/kv-events)"


class PublishError(Exception):
    """A ``--publish`` problem found when binding; the message names the flag."""


def endpoint(text: str) -> str:
    """``--publish``: an endpoint to bind (``tcp://HOST:PORT``, ``ipc://PATH``), checked strictly."""
    try:
        from kv_events.endpoint import parse
    except ImportError:
        raise argparse.ArgumentTypeError(_MISSING) from None
    try:
        parse(text, for_bind=True)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def check_backend(backend: Backend) -> None:
    if not backend.capabilities.wire_events:
        raise PublishError(f"--publish: backend {backend.name!r} does not declare wire_events (its events on the wire)")


@contextmanager
def publishing(
    where: str, backend: Backend, config: KVCacheManagerConfig, subscribers: int
) -> Iterator[KVCacheEventManager]:
    """An event manager for the replay's manager, published on ``where`` until the block ends
    (after the manager's shutdown); says on stderr where, and what it published."""
    from kv_events import EventPublisher

    check_backend(backend)
    events = backend.KVCacheEventManager(EVENT_ENTRIES, "v2_sha256_64")
    try:
        publisher = EventPublisher(events, config, where)
    except ValueError as exc:  # ZeroMQ refused the address as written
        raise PublishError(f"--publish: {exc}") from None
    except OSError as exc:  # busy, or not this machine's
        raise PublishError(f"--publish: {exc.strerror or exc}") from None
    with publisher:
        bound = publisher.endpoint
        print(f"kvcore: publishing KV events on {bound} (watch: kvcore events --subscribe {bound})", file=sys.stderr)
        if subscribers:
            print(f"kvcore: waiting for {plural(subscribers, 'subscriber')} on {bound}", file=sys.stderr)
            while not publisher.wait_for_subscribers(subscribers, timeout=0.5):  # Ctrl-C between waits
                pass
        yield events
    sent = f"{plural(publisher.published_events, 'event')} in {plural(publisher.next_seq, 'batch', 'batches')}"
    print(f"kvcore: published {sent} on {bound}", file=sys.stderr)
