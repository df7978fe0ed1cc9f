"""RedisBlockStore against a real valkey-server the tests start (no mock of the server)."""

from __future__ import annotations

import itertools
import logging
import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from block_chains import NAMESPACE, buffers_for, make_chain, raw_key, round_trip

from kv_store.redis_block_store import RedisBlockStore
from kv_store.store_url import safe_url
from kv_store.valkey_server import ValkeyServer

pytest_plugins = ["store_fixtures"]  # its fixtures (no conftest.py: mypy sees one module per name)

# A loaded 2-core machine may stall a thread for a while: a generous bound on one call to a dead
# server (its timeout is 0.5 s, and an open breaker answers without the network).
CALL_BOUND_S = 2.0


def _store(url: str, **options: object) -> RedisBlockStore:
    return RedisBlockStore(url, **options)  # type: ignore[arg-type]


def test_round_trip_every_byte(valkey: ValkeyServer, client: redis.Redis) -> None:
    keys, values = make_chain(40, 10_000)
    with _store(valkey.url) as store:
        round_trip(store, keys, values)
        # values are opaque: bytes that are no block value go through the same way
        opaque = [os.urandom(777) for _ in range(3)]
        okeys = [b"opaque:%d" % i for i in range(3)]
        owned: list[Any] = [bytearray(v) for v in opaque]
        store.put(okeys, owned)  # a bytearray is copied, not kept
        assert store.flush()
        obuf = buffers_for(opaque)
        assert store.get_into(okeys, obuf) == 3 and [bytes(b) for b in obuf] == opaque
        stats = store.stats()
    assert client.get(keys[7]) == values[7]
    assert stats.written == 43 and stats.hits == 43 and stats.errors == 0
    assert stats.bytes_read == stats.bytes_written == sum(map(len, values + opaque))
    assert stats.calls == 5 and stats.call_seconds > 0  # 2 puts, 1 contains, 2 get_into


def test_contains_counts_the_present_prefix(valkey: ValkeyServer, client: redis.Redis) -> None:
    keys, values = make_chain(300, 1000)  # more than one batch of EXISTS
    with _store(valkey.url, batch=128) as store:
        assert store.contains(keys) == 0
        store.put(keys, values)
        assert store.flush()
        assert store.contains(keys) == 300
        client.delete(keys[200])
        assert store.contains(keys) == 200
        assert store.contains(keys[201:]) == 99
        assert store.contains([b"missing", *keys]) == 0
        assert store.contains([]) == 0
        assert store.stats().lookups == 6
        client.set(keys[200], values[200])
        for hole in (1, 2, 63, 127, 128, 129, 130, 256, 299):  # each place in a run of EXISTS
            client.delete(keys[hole])
            assert store.contains(keys) == hole
            client.set(keys[hole], values[hole])
        assert store.contains(keys) == 300


def test_get_into_stops_at_a_miss_and_at_a_bad_value(valkey: ValkeyServer, client: redis.Redis) -> None:
    keys, values = make_chain(10, 5000)
    with _store(valkey.url, batch=3) as store:  # batches of 3: the stops fall inside and across
        store.put(keys, values)
        assert store.flush()
        client.set(keys[6], values[6][:-1])  # truncated, under its real key
        buffers = buffers_for(values)
        assert store.get_into(keys, buffers) == 6
        assert [bytes(b) for b in buffers[:6]] == values[:6]
        assert store.stats().bad_values == 1
        client.set(keys[4], values[4] + b"x")  # one byte too long
        assert store.get_into(keys, buffers) == 4 and store.stats().bad_values == 2
        client.delete(keys[2])  # a miss is no bad value
        assert store.get_into(keys, buffers) == 2 and store.stats().bad_values == 2
        client.set(keys[0], b"garbage")
        assert store.get_into(keys, buffers) == 0 and store.stats().bad_values == 3
        with pytest.raises(ValueError):
            store.get_into(keys, buffers[:3])


def test_puts_that_continue_a_chain_go_as_one(valkey: ValkeyServer, client: redis.Redis) -> None:
    """A decode's one block per put, queued behind a write in flight: joined into few script calls,
    every block written and scored, whole from the first."""
    keys, values = make_chain(60, 2000, seed=4)
    client.config_resetstat()
    with _store(valkey.url) as store:
        store.put(keys[:1], values[:1])
        for key, value in zip(keys[1:], values[1:], strict=True):
            store.put([key], [value])
        assert store.flush()
        stats = store.stats()
        assert (stats.written, stats.dropped) == (60, 0)
        assert store.contains(keys) == 60
    calls = client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    assert 1 <= calls < 30, calls  # one a put would be 60
    scores = _scores(client, b"kvcore:block-lru", keys)
    assert scores == sorted(scores, reverse=True)  # each block below its parent


def test_puts_of_many_chains_share_a_round_trip(valkey: ValkeyServer, client: redis.Redis) -> None:
    """An engine step's blocks of many caches, queued while the writer lingers: one pipeline for
    all of them, each chain scored on its own; one whose parent is gone is deleted again, the
    others kept."""
    heads = [make_chain(2, 1500, seed=100 + n) for n in range(12)]
    with _store(valkey.url, linger_s=0.5) as store:
        store.put(heads[0][0][:1], heads[0][1][:1])
        assert store.flush()
        exchanges = 0
        real = store._exchange

        def counted(*args: Any, **kwargs: Any) -> Any:
            nonlocal exchanges
            exchanges += 1
            return real(*args, **kwargs)

        store._exchange = counted  # type: ignore[method-assign]
        orphan = make_chain(3, 1500, seed=99)
        store.put(orphan[0][2:], orphan[1][2:])  # its parent was never written
        for keys, values in heads:
            store.put(keys, values)  # a chain's first two blocks: one put each
        assert store.flush()
        stats = store.stats()
    assert exchanges == 1  # was one per put
    assert (stats.written, stats.dropped, stats.skipped) == (24, 1, 1)  # 1 before (then skipped), 23 new
    assert client.exists(orphan[0][2]) == 0
    assert all(client.exists(*keys) == 2 for keys, _ in heads)
    for keys, _ in heads:
        first, second = _scores(client, b"kvcore:block-lru", keys)
        assert first > second


def test_a_put_of_many_chains_scores_each_on_its_own(valkey: ValkeyServer, client: redis.Redis) -> None:
    """One put holding blocks of several chains (a batched commit's): each chain checked and
    scored on its own, so an orphan among them is deleted and the others are kept."""
    first, second = make_chain(2, 1500, seed=7), make_chain(2, 1500, seed=8)
    orphan = make_chain(3, 1500, seed=9)
    with _store(valkey.url) as store:
        store.put([first[0][0], second[0][0]], [first[1][0], second[1][0]])
        assert store.flush()
        keys = [first[0][1], orphan[0][2], second[0][1]]
        store.put(keys, [first[1][1], orphan[1][2], second[1][1]])
        assert store.flush()
        stats = store.stats()
    assert (stats.written, stats.dropped) == (4, 1)
    assert client.exists(orphan[0][2]) == 0
    assert client.exists(*first[0], *second[0]) == 4
    for chain in (first, second):
        head, tail = _scores(client, b"kvcore:block-lru", chain[0])
        assert head > tail


def test_a_chain_may_hang_under_a_block_of_the_same_pipeline(valkey: ValkeyServer, client: redis.Redis) -> None:
    """Puts queued together, a chain's next block behind another chain's put: one pipeline, in
    which the next block's parent is not stored yet when the script runs (its SET NX follows):
    it is whole all the same, and scored below its parent."""
    first, other = make_chain(2, 1500, seed=11), make_chain(1, 1500, seed=12)
    with _store(valkey.url, linger_s=0.5) as store:
        store.put(first[0][:1], first[1][:1])
        store.put(other[0], other[1])
        store.put(first[0][1:], first[1][1:])
        assert store.flush()
        stats = store.stats()
    assert (stats.written, stats.dropped) == (3, 0)
    assert client.exists(*first[0], *other[0]) == 3
    head, tail = _scores(client, b"kvcore:block-lru", first[0])
    assert head > tail


def test_a_key_keeps_its_first_value(valkey: ValkeyServer, client: redis.Redis) -> None:
    keys, first = make_chain(3, 2000, seed=1)
    _, second = make_chain(3, 2000, seed=2)
    with _store(valkey.url) as store:
        store.put(keys, first)
        assert store.flush()
        store.put(keys, [second[0], second[1], second[2]])
        assert store.flush()
        buffers = buffers_for(first)
        assert store.get_into(keys, buffers) == 3
        assert [bytes(b) for b in buffers] == first
        stats = store.stats()
    assert (stats.puts, stats.written, stats.skipped) == (6, 3, 3)


def test_ttl(valkey: ValkeyServer, client: redis.Redis) -> None:
    keys, values = make_chain(2, 1000)
    with _store(valkey.url, ttl=0.4) as store:
        store.put(keys, values)
        assert store.flush()
        assert store.contains(keys) == 2
        assert 0 < client.pttl(keys[0]) <= 400
        time.sleep(0.6)
        assert store.contains(keys) == 0
    with _store(valkey.url) as store:  # no ttl: no expiry
        store.put(keys, values)
        assert store.flush()
        assert client.pttl(keys[0]) == -1


def test_put_is_bounded_in_memory(valkey: ValkeyServer, client: redis.Redis) -> None:
    keys, values = make_chain(10, 4000)
    with _store(valkey.url, max_pending_bytes=9000) as store:  # room for 2 values
        store.put(keys, values)
        assert store.stats().dropped == 8  # counted at once: put never waits
        assert store.flush()
        assert store.contains(keys) == 2  # it kept the chain's first blocks, not any two
        stats = store.stats()
    assert (stats.puts, stats.written, stats.dropped) == (10, 2, 8)


def test_close_flushes_then_drops(valkey: ValkeyServer, client: redis.Redis) -> None:
    keys, values = make_chain(5, 1000)
    store = _store(valkey.url)
    store.put(keys, values)
    store.close()
    store.close()  # idempotent
    assert client.exists(*keys) == 5
    store.put(keys, values)  # after close: dropped, no exception, no network
    assert store.contains(keys) == 0 and store.get_into(keys, buffers_for(values)) == 0
    assert store.stats().dropped == 5


def test_a_dead_server_costs_misses_not_hangs(server_factory: type[ValkeyServer]) -> None:
    server = server_factory().start()
    keys, values = make_chain(20, 2000)
    store = _store(server.url, timeout=0.5, backoff_s=0.3, max_backoff_s=0.6)
    assert store.put(keys, values) is None  # up: no pause asked
    assert store.flush()
    server.kill()
    buffers = buffers_for(values)
    start = time.monotonic()
    pauses = []
    for _ in range(50):
        t = time.monotonic()
        assert store.contains(keys) == 0
        assert store.get_into(keys, buffers) == 0
        pauses.append(store.put(keys, values))
        assert time.monotonic() - t < CALL_BOUND_S
    # while the breaker is open a put asks the manager for a pause: its backoff's rest
    assert any(p is not None and 0 < p <= 0.6 for p in pauses)
    assert time.monotonic() - start < 3 * CALL_BOUND_S
    stats = store.stats()
    assert stats.errors >= 1 and stats.breaker_opens >= 1
    assert stats.dropped >= 20  # puts while down
    server.restart()  # same port, empty
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and store.contains(keys) < 20:
        store.put(keys, values)
        store.flush(1.0)
        time.sleep(0.1)
    assert store.contains(keys) == 20
    assert store.get_into(keys, buffers) == 20 and [bytes(b) for b in buffers] == values
    store.close()
    assert store.put(keys, values) == math.inf  # closed: for ever


def test_a_server_gone_mid_write_loses_only_writes(server_factory: type[ValkeyServer]) -> None:
    server = server_factory().start()
    store = _store(server.url, timeout=0.5, backoff_s=5.0, close_timeout=2.0)
    keys, values = make_chain(64, 64 << 10)
    store.put(keys, values)
    server.kill()  # while the writer may be busy with them
    start = time.monotonic()
    store.close()
    assert time.monotonic() - start < 2.0 + 4 * 0.5 + CALL_BOUND_S
    stats = store.stats()
    assert stats.written + stats.skipped + stats.dropped == 64


def test_a_server_refusing_scripts_gets_plain_writes(
    server_factory: type[ValkeyServer], caplog: pytest.LogCaptureFixture
) -> None:
    """An ACL user without scripting: the chain LRU goes off (one warning) and the blocks are
    still written, by plain pipelined SET NX, and read back."""
    server = server_factory(password="admin-pw", username="admin").start()
    admin = redis.Redis.from_url(server.url)
    admin.acl_setuser("plain", enabled=True, passwords=["+plain-pw"], keys=["*"], commands=["+@all", "-@scripting"])
    url = f"redis://plain:plain-pw@127.0.0.1:{server.port}/0"
    chains = [make_chain(6, 1000, seed=s) for s in range(5)]
    with _store(url) as store:
        for keys, values in chains:
            store.put(keys, values)
            assert store.flush()
        assert all(store.contains(keys) == 6 for keys, _ in chains)
        buffers = buffers_for(chains[-1][1])
        assert store.get_into(chains[-1][0], buffers) == 6 and [bytes(b) for b in buffers] == chains[-1][1]
        stats = store.stats()
    assert (stats.written, stats.dropped, stats.errors) == (30, 0, 0)
    assert caplog.text.count("chain LRU off") == 1
    assert admin.exists(b"kvcore:block-lru") == 0  # no index without scripts
    admin.close()


def test_password_never_shows(server_factory: type[ValkeyServer], caplog: pytest.LogCaptureFixture) -> None:
    secret = "hunter2-s3cret"
    caplog.set_level(logging.DEBUG)
    server = server_factory(password=secret, username="kvcore").start()
    keys, values = make_chain(4, 1000)
    with _store(server.url) as good:
        good.put(keys, values)
        assert good.flush()
        assert good.contains(keys) == 4
        assert secret not in repr(good) + str(good) + good.url
    wrong = server.url.replace(secret, "not-" + secret)
    bad = _store(wrong, backoff_s=0.1)
    assert bad.contains(keys) == 0
    time.sleep(0.15)
    assert bad.get_into(keys, buffers_for(values)) == 0
    bad.put(keys, values)
    bad.close()
    stats = bad.stats()
    assert stats.errors >= 1 and stats.hits == 0 and stats.dropped == 4
    shown = repr(bad) + str(bad) + repr(stats) + caplog.text + bad.url
    assert "failed" in caplog.text  # the fault was logged, without the password
    assert secret not in shown and "kvcore:" not in bad.url
    with pytest.raises(ValueError) as error:
        _store(f"nosuch://kvcore:{secret}@127.0.0.1:1")
    assert secret not in str(error.value)


def test_safe_url() -> None:
    assert safe_url("redis://user:pw@host:6379/2") == "redis://***@host:6379/2"
    assert safe_url("rediss://:pw@host:6380") == "rediss://***@host:6380"
    assert safe_url("redis://host:1/0?password=pw&db=3") == "redis://host:1/0?password=***&db=3"
    assert safe_url("unix:///tmp/v.sock?password=pw") == "unix:///tmp/v.sock?password=***"
    assert safe_url("redis://127.0.0.1:6379") == "redis://127.0.0.1:6379"


def test_a_full_noeviction_server_drops_puts(
    server_factory: type[ValkeyServer], caplog: pytest.LogCaptureFixture
) -> None:
    server = server_factory(maxmemory="3mb", maxmemory_policy="noeviction").start()
    plain = redis.Redis.from_url(server.url)
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        for i in range(100):  # other data fills it: the store may not evict that
            plain.set(f"other:{i}", os.urandom(100_000))
    keys, values = make_chain(8, 20_000)
    store = _store(server.url, backoff_s=0.05)
    store.put(keys, values)
    assert store.flush()
    stats = store.stats()
    assert stats.written == 0 and stats.dropped == 8 and stats.errors >= 1
    assert store.contains(keys) == 0
    store.close()
    plain.close()


def test_the_stores_lru_makes_room_on_a_noeviction_server(server_factory: type[ValkeyServer]) -> None:
    server = server_factory(maxmemory="4mb", maxmemory_policy="noeviction").start()
    empty = redis.Redis.from_url(server.url).info("memory")["used_memory"]  # the server's own
    with _store(server.url) as store:
        chains = [make_chain(10, 20_000, seed=s) for s in range(50)]  # 10 MB in all
        for keys, values in chains:
            store.put(keys, values)
            assert store.flush()
        stats = store.stats()
        assert stats.errors == 0 and stats.evicted > 0 and stats.written == 500
        present = [store.contains(keys) for keys, _ in chains]
    assert present[-1] == 10  # the last written is whole
    # Most of the room: the store keeps two requests' worth free (the next one arrives first).
    assert sum(present) * 20_000 > ((4 << 20) - empty) / 2
    for (keys, _), n in zip(chains, present, strict=True):
        plain = redis.Redis.from_url(server.url)
        assert plain.exists(*keys) == n  # nothing past a hole: evicted from the tail
        plain.close()


def _scores(client: redis.Redis, index: bytes, keys: list[bytes]) -> list[float]:
    scores = [client.zscore(index, k) for k in keys]
    assert all(s is not None for s in scores), "every block is in the index"
    return [float(s) for s in scores if s is not None]


def test_reads_keep_a_chains_head_recent(valkey: ValkeyServer, client: redis.Redis) -> None:
    keys, values = make_chain(30, 1000)
    with _store(valkey.url, touch_window_s=0.0) as store:
        store.put(keys, values)
        assert store.flush()
        index = store.index_key
        scores = _scores(client, index, keys)
        assert all(a > b for a, b in itertools.pairwise(scores))  # head scores highest
        time.sleep(0.05)
        assert store.get_into(keys[25:], buffers_for(values[25:])) == 5  # a manager with 25 locally
        assert store.flush()
        after = _scores(client, index, keys)
    assert after[0] > scores[0] and after[0] > after[25] > scores[29]
    assert all(a > b for a, b in itertools.pairwise(after))


def test_a_tail_without_its_head_is_not_written(valkey: ValkeyServer, client: redis.Redis) -> None:
    keys, values = make_chain(6, 1000)
    with _store(valkey.url) as store:
        store.put(keys[:3], values[:3])
        assert store.flush()
        client.delete(keys[2])  # evicted meanwhile
        store.put(keys[3:], values[3:])  # its parent is gone: no reader could reach it
        assert store.flush()
        assert client.exists(*keys[3:]) == 0
        assert store.stats().dropped == 3
        store.put(keys[2:], values[2:])  # a manager that recomputed the hole: all written
        assert store.flush()
        assert store.contains(keys) == 6
    with _store(valkey.url, order_chains=False) as naive:  # without the index: written as asked
        client.flushall()
        naive.put(keys[3:], values[3:])
        assert naive.flush() and client.exists(*keys[3:]) == 3


_WRITER = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[2])
    from block_chains import make_chain
    from kv_store.redis_block_store import RedisBlockStore
    keys, values = make_chain(12, 30_000, seed=7)
    store = RedisBlockStore(sys.argv[1])
    store.put(keys, values)
    store.close()
    print(store.stats().written)
    """
)


def test_two_processes_share_blocks(valkey: ValkeyServer, client: redis.Redis) -> None:
    here = str(Path(__file__).parent)
    done = subprocess.run(
        [sys.executable, "-c", _WRITER, valkey.url, here], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "12"
    keys, values = make_chain(12, 30_000, seed=7)
    with _store(valkey.url) as reader:
        buffers = buffers_for(values)
        assert reader.contains(keys) == 12
        assert reader.get_into(keys, buffers) == 12
        assert [bytes(b) for b in buffers] == values
    assert raw_key(keys[0]) in values[0] and keys[0].startswith(NAMESPACE)
