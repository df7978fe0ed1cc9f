"""The store ``--remote`` names, opened for one run and closed after it (docs/store.md): a
Valkey/Redis server at a URL, an embedded ``valkey-server`` started for the run, or a directory.
Credentials in a URL are never shown: every message and report uses ``shown``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

from kv_api import BlockStore
from kv_replay.options import OptionError

__all__ = ["open_store", "shown", "store_stats"]

_INSTALL = "pip install './packages/kv-store[redis,server]'"
#: The embedded server's memory: bounded, evicting least recently used keys, as a fleet's would be.
EMBEDDED_MAXMEMORY = "1gb"


def shown(spec: str) -> str:
    """``spec`` as messages may repeat it: a URL without its user and password."""
    if "://" not in spec:
        return spec
    scheme, rest = spec.split("://", 1)
    host = rest.rsplit("@", 1)[-1]
    return f"{scheme}://{host}"


@contextmanager
def open_store(spec: str) -> Iterator[BlockStore]:
    """The store of ``spec`` for the ``with`` block, closed (and an embedded server stopped) after
    it, also on an interrupt. A store that cannot be opened is an ``OptionError`` of ``--remote``."""
    try:
        import kv_store
        from kv_store.valkey_server import ValkeyServer
    except ImportError:
        raise OptionError("remote", f"kv_store is not installed ({_INSTALL})", shown(spec)) from None
    if spec == "valkey":
        try:
            server = ValkeyServer(maxmemory=EMBEDDED_MAXMEMORY, maxmemory_policy="allkeys-lru").start()
        except (OSError, RuntimeError) as exc:
            raise OptionError("remote", f"cannot start an embedded valkey-server: {exc}", spec) from None
        try:
            with _opened(spec, lambda: kv_store.RedisBlockStore(server.url)) as store:
                yield store
        finally:
            server.stop()
        return
    if spec.startswith("file:"):
        with _opened(spec, lambda: kv_store.FileBlockStore(spec[len("file:") :])) as store:
            yield store
        return
    with _opened(spec, lambda: kv_store.RedisBlockStore(spec)) as store:
        yield store


@contextmanager
def _opened(spec: str, make: Any) -> Iterator[BlockStore]:
    try:
        store = make()
    except ImportError as exc:  # the redis client
        raise OptionError("remote", f"{exc.name or 'redis'} is not installed ({_INSTALL})", shown(spec)) from None
    except (OSError, ValueError, RuntimeError) as exc:  # a bad URL, a directory in use or not creatable
        raise OptionError("remote", str(exc), shown(spec)) from None
    try:
        yield store
    finally:
        store.close()


def store_stats(store: BlockStore) -> dict[str, Any] | None:
    """The store's own counters (``kv_store.StoreStats``), where it keeps them."""
    stats = getattr(store, "stats", None)
    return asdict(stats()) if callable(stats) else None
