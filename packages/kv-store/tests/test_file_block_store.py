"""FileBlockStore on real directories: values, chains, restarts, kill -9, the size bound, faults."""

from __future__ import annotations

import errno
import hashlib
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kv_api.block_value import encode_value
from kv_store.file_block_store import FileBlockStore
from kv_store.file_index import TEMP_PREFIX

NS = b"kvcore:test@r0:0123456789abcdef:"
FINGERPRINT = hashlib.sha256(b"layout").digest()
ROOT = hashlib.sha256(b"scope root").digest()
TOKENS = 16
PAGE = 4096

Chain = tuple[list[bytes], list[bytes]]


def pattern(seed: bytes, size: int) -> bytes:
    return hashlib.shake_256(seed).digest(size)


def chain(name: str, n: int, *, prefix: Chain | None = None, page: int = PAGE, ns: bytes = NS) -> Chain:
    """Keys and real values (block_value headers) of a chain of ``n`` blocks, after ``prefix``'s."""
    keys, values = (list(prefix[0]), list(prefix[1])) if prefix else ([], [])
    parent = keys[-1][-32:] if keys else ROOT
    for i in range(len(keys), n):
        raw = hashlib.sha256(f"{name}:{i}".encode() + parent).digest()
        page_bytes = pattern(raw, page)
        values.append(encode_value(FINGERPRINT, raw, parent, (i + 1) * TOKENS, TOKENS, [page_bytes], [page]))
        keys.append(ns + raw)
        parent = raw
    return keys, values


def read_all(store: FileBlockStore, keys: list[bytes], size: int) -> tuple[int, list[bytearray]]:
    buffers = [bytearray(size) for _ in keys]
    return store.get_into(keys, [memoryview(b) for b in buffers]), buffers


def block_files(path: Path) -> list[Path]:
    return [p for p in path.iterdir() if p.name.endswith(".kv")]


def file_of(path: Path, key: bytes) -> Path:
    (found,) = path.glob(hashlib.sha256(key).hexdigest() + ".*")
    return found


def disk_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in block_files(path))


@pytest.fixture
def open_store(tmp_path: Path) -> Iterator[Callable[..., FileBlockStore]]:
    stores: list[FileBlockStore] = []

    def make(path: Path | None = None, **kwargs: int) -> FileBlockStore:
        stores.append(FileBlockStore(path or tmp_path / "store", **kwargs))
        return stores[-1]

    yield make
    for store in stores:
        store.close()


def test_round_trip_every_byte(open_store: Callable[..., FileBlockStore], tmp_path: Path) -> None:
    store = open_store()
    keys = [NS + hashlib.sha256(b"%d" % i).digest() for i in range(8)]
    values = [pattern(k, 65536) for k in keys]  # opaque values: no header
    store.put(keys, values)
    n, buffers = read_all(store, keys, 65536)  # queued or written: served either way
    assert n == 8 and [bytes(b) for b in buffers] == values
    assert store.flush(10)
    n, buffers = read_all(store, keys, 65536)
    assert n == 8 and [bytes(b) for b in buffers] == values
    assert sorted(p.read_bytes() for p in block_files(tmp_path / "store")) == sorted(values)
    stats = store.stats()
    assert (stats.puts, stats.written, stats.hits, stats.bytes_written) == (8, 8, 16, 8 * 65536)
    assert stats.calls == 3 and stats.errors == stats.dropped == stats.bad_values == 0


def test_contains_and_get_into_stop_at_a_miss(open_store: Callable[..., FileBlockStore]) -> None:
    store = open_store()
    keys, values = chain("a", 6)
    store.put(keys[:4], values[:4])
    assert store.contains(keys) == 4 and store.contains([]) == 0 and store.contains(keys[1:]) == 3
    assert store.flush(10)
    assert store.contains(keys[:2] + keys[5:] + keys[2:4]) == 2
    n, buffers = read_all(store, keys[:2] + keys[5:] + keys[2:4], len(values[0]))
    assert n == 2 and [bytes(b) for b in buffers[:2]] == values[:2]
    assert store.get_into([], []) == 0


def test_put_of_a_stored_key_keeps_the_first_value(open_store: Callable[..., FileBlockStore]) -> None:
    store = open_store()
    keys = [NS + bytes(32), NS + bytes([1]) * 32]
    store.put(keys[:1], [b"first" * 10])
    store.put(keys[:1], [b"other" * 10])  # still queued
    assert store.flush(10)
    store.put(keys, [b"again" * 10, b"fresh" * 10])  # on disk
    assert store.flush(10)
    n, buffers = read_all(store, keys, 50)
    assert n == 2 and bytes(buffers[0]) == b"first" * 10 and bytes(buffers[1]) == b"fresh" * 10
    assert (store.stats().skipped, store.stats().written) == (2, 2)


@pytest.mark.parametrize("reopen", [False, True], ids=["open", "reopened"])
@pytest.mark.parametrize("kind", ["garbage", "truncated", "other-layout"])
def test_bad_values_are_misses_and_deleted(tmp_path: Path, kind: str, reopen: bool) -> None:
    path = tmp_path / "store"
    keys, values = chain("a", 4)
    store = FileBlockStore(path)
    store.put(keys, values)
    assert store.flush(10)
    if reopen:
        store.close()
    bad = {
        "garbage": os.urandom(len(values[2]) + 7),
        "truncated": values[2][: len(values[2]) // 2],
        "other-layout": chain("a", 3, page=2 * PAGE)[1][2],
    }[kind]
    target = file_of(path, keys[2])
    target.write_bytes(bad)
    if reopen:
        store = FileBlockStore(path)
    n, buffers = read_all(store, keys, len(values[0]))
    assert n == 2 and [bytes(b) for b in buffers[:2]] == values[:2]
    assert store.stats().bad_values == 1 and not target.exists()
    assert read_all(store, keys, len(values[0]))[0] == 2 and store.contains(keys) == 2
    assert store.stats().bad_values == 1  # now a plain miss
    store.close()


def test_warm_start_across_processes(tmp_path: Path) -> None:
    path = tmp_path / "store"
    script = textwrap.dedent(f"""
        import hashlib, sys
        from kv_store.file_block_store import FileBlockStore
        store = FileBlockStore(sys.argv[1])
        keys = [{NS!r} + hashlib.sha256(b"%d" % i).digest() for i in range(16)]
        store.put(keys, [hashlib.shake_256(k).digest(10000) for k in keys])
        store.close()
        assert store.stats().written == 16, store.stats()
    """)
    subprocess.run([sys.executable, "-c", script, str(path)], check=True, timeout=60)
    keys = [NS + hashlib.sha256(b"%d" % i).digest() for i in range(16)]
    with FileBlockStore(path) as store:
        assert store.contains(keys) == 16
        n, buffers = read_all(store, keys, 10000)
        assert n == 16 and all(bytes(b) == pattern(k, 10000) for k, b in zip(keys, buffers, strict=True))


KILL_WRITER = """
import hashlib, sys
from kv_store.file_block_store import FileBlockStore
path, size = sys.argv[1], int(sys.argv[2])
store = FileBlockStore(path, max_bytes=64 * size, max_pending_bytes=16 * size)
i = 0
while True:
    keys = [NS + hashlib.sha256(b"%d" % (i + j)).digest() for j in range(4)]
    store.put(keys, [hashlib.shake_256(k).digest(size) for k in keys])
    store.flush(0.005)
    i += 4
"""


def test_kill_9_during_writes_never_serves_a_partial_block(tmp_path: Path) -> None:
    path, size = tmp_path / "store", 256 << 10
    writer = subprocess.Popen([sys.executable, "-c", f"NS = {NS!r}" + KILL_WRITER, str(path), str(size)])
    try:
        deadline = time.monotonic() + 30
        while (not path.exists() or len(block_files(path)) < 40) and time.monotonic() < deadline:
            time.sleep(0.02)  # evicting by now: the bound is 64 values
        time.sleep(random.uniform(0.0, 0.2))
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    by_id = {hashlib.sha256(NS + hashlib.sha256(b"%d" % i).digest()).hexdigest(): i for i in range(50000)}
    with FileBlockStore(path, max_bytes=64 * size) as store:
        assert not [p for p in path.iterdir() if p.name.startswith(TEMP_PREFIX)]
        files = block_files(path)
        assert 0 < len(files) <= 64
        for file in files:
            key = NS + hashlib.sha256(b"%d" % by_id[file.name.split(".")[0]]).digest()
            n, (buffer,) = read_all(store, [key], size)
            assert n == 1 and bytes(buffer) == pattern(key, size)
        assert store.stats().hits == len(files) and store.stats().bad_values == 0


def reachable_fraction(store: FileBlockStore, chains: list[Chain], path: Path) -> float:
    """Bytes on disk a reader reaches from its chain's first block, over all bytes on disk."""
    reachable: set[bytes] = set()
    for keys, _ in chains:
        reachable.update(keys[: store.contains(keys)])
    stored = disk_bytes(path)
    return sum(file_of(path, k).stat().st_size for k in reachable) / stored if stored else 1.0


def test_size_bound_evicts_lru_chains_from_their_tail(
    open_store: Callable[..., FileBlockStore], tmp_path: Path
) -> None:
    old = [chain(f"old{i}", 16) for i in range(12)]
    new: list[Chain] = []
    for i in range(6):  # pairs sharing their first 4 blocks: a tree, not only chains
        trunk = chain(f"new{i}", 4)
        new += [chain(f"new{i}a", 16, prefix=trunk), chain(f"new{i}b", 16, prefix=trunk)]
    size = len(old[0][1][0])
    hot, cold = old[:4], old[4:]
    bound = (4 * 16 + 6 * 28 + 2) * size
    store = open_store(max_bytes=bound)
    for keys, values in old:
        for start in range(0, 16, 4):  # as a manager commits them: a few blocks at a time
            store.put(keys[start : start + 4], values[start : start + 4])
    assert store.flush(10)
    for keys, _ in hot:
        assert read_all(store, keys, size)[0] == 16
    for keys, values in new:
        store.put(keys, values)
    assert store.flush(10)
    assert disk_bytes(tmp_path / "store") <= bound
    assert all(store.contains(keys) == 16 for keys, _ in hot + new)
    assert sum(store.contains(keys) for keys, _ in cold) < 16
    assert store.stats().evicted >= 16 * 8 - 2 and store.stats().dropped == 0
    assert reachable_fraction(store, old + new, tmp_path / "store") >= 0.9


def test_size_bound_holds_across_restarts(tmp_path: Path) -> None:
    path = tmp_path / "store"
    chains = [chain(f"c{i}", 16) for i in range(8)]
    size = len(chains[0][1][0])
    with FileBlockStore(path) as store:
        for keys, values in chains:
            store.put(keys, values)
        assert store.flush(10)
        time.sleep(0.01)
        assert read_all(store, chains[0][0], size)[0] == 16  # the oldest chain, used last
    with FileBlockStore(path, max_bytes=3 * 16 * size) as store:  # a smaller bound: evicts at open
        assert disk_bytes(path) <= 3 * 16 * size and store.stats().evicted == 5 * 16
        assert store.contains(chains[0][0]) == 16 and store.contains(chains[7][0]) == 16
        assert reachable_fraction(store, chains, path) >= 0.9
        keys, values = chain("late", 16)
        store.put(keys, values)
        assert store.flush(10) and disk_bytes(path) <= 3 * 16 * size
        assert store.contains(keys) == 16 and store.contains(chains[0][0]) == 16
        assert reachable_fraction(store, [*chains, (keys, values)], path) >= 0.9


def test_reachability_under_a_manager_like_workload(tmp_path: Path) -> None:
    """Chains branching off earlier ones, put from where the manager's own blocks end (the store may
    have lost that prefix), read from a random block on: what the store keeps stays reachable."""
    rng = random.Random(7)
    path = tmp_path / "store"
    chains: list[Chain] = []
    size = len(chain("x", 1)[1][0])
    with FileBlockStore(path, max_bytes=150 * size) as store:
        for step in range(200):
            if rng.random() < 0.4 or not chains:
                base = rng.choice(chains) if chains and rng.random() < 0.5 else None
                cut = rng.randint(1, len(base[0])) if base else 0
                keys, values = chain(
                    f"s{step}", cut + rng.randint(4, 40), prefix=(base[0][:cut], base[1][:cut]) if base else None
                )
                chains.append((keys, values))
                for start in range(cut, len(keys), 8):
                    store.put(keys[start : start + 8], values[start : start + 8])
            else:
                keys, _ = rng.choice(chains)
                read_all(store, keys[rng.randint(0, len(keys) - 1) :], size)
            if step % 20 == 0:
                assert store.flush(10)
        assert store.flush(10) and store.stats().evicted > 500
        assert disk_bytes(path) <= 150 * size
        live = reachable_fraction(store, chains, path)
    with FileBlockStore(path, max_bytes=75 * size) as store:
        assert disk_bytes(path) <= 75 * size
        restarted = reachable_fraction(store, chains, path)
    print(f"reachable: {live:.3f} live, {restarted:.3f} after a restart at half the bound")
    assert live >= 0.9 and restarted >= 0.9


def test_a_suffix_without_its_prefix_never_displaces_a_chain(open_store: Callable[..., FileBlockStore]) -> None:
    kept, kept_values = chain("kept", 16)
    suffix, suffix_values = chain("suffix", 16)
    size = len(kept_values[0])
    store = open_store(max_bytes=20 * size)
    store.put(kept, kept_values)
    store.put(suffix[8:], suffix_values[8:])  # its first 8 blocks were never stored here
    assert store.flush(10)
    assert store.contains(kept) == 16 and store.contains(suffix[8:]) == 4  # free room only
    assert (store.stats().evicted, store.stats().dropped) == (0, 4)
    more, more_values = chain("more", 4)
    store.put(more, more_values)  # a chain from its first block: the suffix goes first
    assert store.flush(10)
    assert store.contains(more) == 4 and store.contains(kept) == 16 and store.contains(suffix[8:]) == 0


def test_a_chain_longer_than_the_bound_keeps_its_prefix(open_store: Callable[..., FileBlockStore]) -> None:
    keys, values = chain("long", 32)
    store = open_store(max_bytes=10 * len(values[0]))
    store.put(keys, values)
    assert store.flush(10)
    assert store.contains(keys) == 10 and store.stats().dropped == 22 and store.stats().evicted == 0


def test_queue_bound_drops_the_rest_of_the_batch(open_store: Callable[..., FileBlockStore]) -> None:
    keys, values = chain("q", 10)
    store = open_store(max_pending_bytes=3 * len(values[0]))
    store.put(keys, values)  # one call under the lock: the writer frees nothing meanwhile
    assert store.flush(10)
    assert store.contains(keys) == 3
    assert (store.stats().written, store.stats().dropped) == (3, 7)


def test_enospc_drops_the_block_and_its_chain(
    open_store: Callable[..., FileBlockStore], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store()
    real_write = os.write
    failures = [1]

    def write(fd: int, data: bytes | memoryview) -> int:
        if failures and os.readlink(f"/proc/self/fd/{fd}").startswith(str(tmp_path)):
            failures.pop()
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    keys, values = chain("full", 4)
    store.put(keys, values)
    assert store.flush(10)
    stats = store.stats()
    assert (stats.errors, stats.dropped, stats.written) == (1, 4, 0) and store.contains(keys) == 0
    assert not [p for p in (tmp_path / "store").iterdir() if p.name.startswith(TEMP_PREFIX)]
    store.put(keys, values)  # the disk has room again
    assert store.flush(10) and store.contains(keys) == 4 and store.stats().written == 4


def test_directory_removed_after_start(open_store: Callable[..., FileBlockStore], tmp_path: Path) -> None:
    store = open_store()
    keys, values = chain("gone", 4)
    store.put(keys, values)
    assert store.flush(10)
    shutil.rmtree(tmp_path / "store")
    assert read_all(store, keys, len(values[0]))[0] == 0 and store.contains(keys) == 0
    more, more_values = chain("more", 4)
    store.put(more, more_values)
    assert store.flush(10) and store.contains(more) == 0
    stats = store.stats()
    assert stats.errors == 2 and stats.dropped == 4 and stats.hits == 0


def test_read_only_directory_serves_and_drops(tmp_path: Path) -> None:
    path = tmp_path / "store"
    keys, values = chain("ro", 4)
    with FileBlockStore(path) as store:
        store.put(keys, values)
        assert store.flush(10)
    if os.geteuid() == 0:  # root writes through mode bits: the immutable attribute stops it
        if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
            pytest.skip("no chattr +i here")
    else:
        path.chmod(0o555)
    try:
        with FileBlockStore(path) as store:
            more, more_values = chain("more", 4)
            store.put(more, more_values)
            assert store.flush(10)
            assert read_all(store, keys, len(values[0]))[0] == 4 and store.contains(more) == 0
            assert store.stats().errors == 1 and store.stats().dropped == 4
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        path.chmod(0o755)


def test_open_removes_temp_files_only(tmp_path: Path) -> None:
    path = tmp_path / "store"
    path.mkdir()
    (path / f"{TEMP_PREFIX}7").write_bytes(b"torn")
    (path / "README").write_text("an operator's note")
    with FileBlockStore(path) as store:
        assert sorted(p.name for p in path.iterdir()) == [".lock", "README"]
        assert store.contains([NS + bytes(32)]) == 0


def test_one_store_per_directory(open_store: Callable[..., FileBlockStore], tmp_path: Path) -> None:
    store = open_store()
    with pytest.raises(RuntimeError, match="in use"):
        FileBlockStore(tmp_path / "store")
    store.close()
    open_store().close()
    with pytest.raises(FileNotFoundError):
        FileBlockStore(tmp_path / "no" / "parent")


def test_close_is_idempotent_and_joins(open_store: Callable[..., FileBlockStore]) -> None:
    store = open_store()
    keys, values = chain("c", 8)
    assert store.put(keys, values) is None
    store.close()
    store.close()
    assert store.stats().written == 8  # close flushed
    assert not [t for t in threading.enumerate() if t.name.startswith("FileBlockStore")]
    assert store.put(keys, values) == math.inf  # closed: the manager hands it nothing more
    assert store.contains(keys) == 0 and read_all(store, keys, len(values[0]))[0] == 0
    assert store.stats().dropped == 8


def test_threads_share_a_store(open_store: Callable[..., FileBlockStore]) -> None:
    store = open_store(max_bytes=200 * (PAGE + 200))
    errors: list[BaseException] = []

    def work(name: str) -> None:
        try:
            for i in range(20):
                keys, values = chain(f"{name}{i}", 8)
                store.put(keys, values)
                n, buffers = read_all(store, keys, len(values[0]))
                assert [bytes(b) for b in buffers[:n]] == values[:n]
        except BaseException as error:  # noqa: BLE001 - reported by the test thread below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(f"t{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and store.flush(10)


def test_open_scans_many_files_fast(tmp_path: Path) -> None:
    path = tmp_path / "store"
    path.mkdir()
    for i in range(6000):  # sparse files: a size to count, no data to write
        ident = hashlib.sha256(b"%d" % i).hexdigest()
        parent = hashlib.sha256(b"%d" % (i - 1)).hexdigest() if i % 16 else "-"
        fd = os.open(path / f"{ident}.{parent}.{(i % 16 + 1) * TOKENS}.kv", os.O_WRONLY | os.O_CREAT, 0o644)
        os.ftruncate(fd, 100)
        os.close(fd)
    start = time.perf_counter()
    with FileBlockStore(path, max_bytes=5700 * 100) as store:
        opened = time.perf_counter() - start  # 100k files: ~2 s on a loaded 2-core machine
        assert store.stats().evicted == 300
    assert opened < 5.0 and len(block_files(path)) == 5700
