"""Store benchmark (issue 26): the remote tier's store and what attaching it costs, side by side in
one run, on a real ``valkey-server`` started for the run (``kv_store.ValkeyServer``).

- Throughput: a chain of block values (real headers, so the chain-aware LRU does its work) put
  through ``RedisBlockStore`` (``put`` per batch, then ``flush`` until the server has them all)
  and read back with ``get_into``, against plain pipelined ``SET NX`` / ``MGET`` of the same bytes
  in the same batches with the same ``redis`` client. Each round writes fresh keys. The store
  packs its commands itself (values sent from the caller's bytes, values read straight into the
  buffers) on the client's connection; the plain side is the client's own pipeline. A read right
  after the put finds its blocks scored less than a window ago (no touch); a read a window later
  scores each batch afresh.
- bench_manager's decode step (one cache), decode iteration (``--running`` caches, batched),
  cold and cached admission, per backend, with a remote tier attached against without: on
  ``NullStore`` (the manager's own side: values encoded and handed over, lookups asked) and on
  the server through ``RedisBlockStore`` (its client, writer thread and, on one machine, the
  server's own work). A decode writes a block through every ``tokens_per_block`` tokens (staged,
  handed to the store 16 at a time); a cold admission asks the store once.
- A fleet: ``kvcore replay`` of the first ``--limit`` requests of the Mooncake synthetic trace on
  ``--instances`` managers, the cluster hit rate with the shared store (``--remote valkey``)
  against without it, and one instance whose pool holds the whole trace (the most reuse there is).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np
from bench_manager import iteration
from bench_manager import measure as measure_manager

import kv_api
from kv_api.block_value import encode_value
from kv_store import RedisBlockStore
from kv_store.valkey_server import ValkeyServer

TOKENS_PER_BLOCK = 32


def chain_values(namespace: bytes, blocks: int, page_bytes: int) -> tuple[list[bytes], list[bytes]]:
    """Store keys and values of one chain of ``blocks`` blocks with ``page_bytes`` of payload each."""
    fingerprint = hashlib.sha256(b"bench-layout").digest()
    payload = np.random.default_rng(3).integers(0, 256, page_bytes, dtype=np.uint8).tobytes()
    keys, values = [], []
    parent = hashlib.sha256(namespace + b"root").digest()  # a first block's parent: its root
    for i in range(blocks):
        key = hashlib.sha256(namespace + i.to_bytes(8, "little")).digest()
        values.append(
            encode_value(
                fingerprint, key, parent, (i + 1) * TOKENS_PER_BLOCK, TOKENS_PER_BLOCK, [payload], [page_bytes]
            )
        )
        keys.append(namespace + key)
        parent = key
    return keys, values


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def batches(n: int, size: int) -> list[slice]:
    return [slice(i, min(n, i + size)) for i in range(0, n, size)]


def throughput_round(url: str, round_: int, blocks: int, page_bytes: int, batch: int) -> dict[str, float]:
    """Seconds to write and to read ``blocks`` values, through the store and raw."""
    import redis

    out: dict[str, float] = {}
    client = redis.Redis.from_url(url, socket_timeout=5)
    client.flushall()
    keys, values = chain_values(f"store{round_}:".encode(), blocks, page_bytes)
    raw_keys, _ = chain_values(f"raw{round_}:".encode(), blocks, page_bytes)
    parts = batches(blocks, batch)
    buffers = [memoryview(bytearray(len(values[0]))) for _ in range(blocks)]
    for buffer in buffers:  # faulted in now: the first side timed would pay for it alone
        buffer[:] = values[0]

    def raw_put() -> None:
        for part in parts:
            pipe = client.pipeline(transaction=False)
            for key, value in zip(raw_keys[part], values[part], strict=True):
                pipe.set(key, value, nx=True)
            pipe.execute()

    def raw_get() -> None:
        for part in parts:
            for value, buffer in zip(client.mget(raw_keys[part]), buffers[part], strict=True):
                assert isinstance(value, bytes)
                buffer[:] = value

    with RedisBlockStore(url, client=client, timeout=5, max_pending_bytes=4 * blocks * len(values[0])) as store:

        def put() -> None:
            for part in parts:
                store.put(keys[part], values[part])
            assert store.flush(60)

        def get() -> None:
            for part in parts:
                assert store.get_into(keys[part], buffers[part]) == part.stop - part.start

        def through_store() -> None:
            out["put"] = timed(put)
            out["get"] = timed(get)  # the blocks scored less than a window ago: no touch
            time.sleep(store.touch_window_s + 0.1)
            out["get_late"] = timed(get)  # each batch's blocks scored afresh (one ancestor walked)

        def plain() -> None:
            out["raw_put"] = timed(raw_put)
            out["raw_get"] = timed(raw_get)

        # odd rounds time the plain side first: neither side always meets a fresher server
        for side in (through_store, plain) if round_ % 2 == 0 else (plain, through_store):
            side()
        stats = store.stats()
        assert stats.written == blocks and stats.dropped == 0, stats
    client.close()
    return out


def best(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {k: min(r[k] for r in rounds) for k in rounds[0]}


def throughput(url: str, args: argparse.Namespace) -> None:
    page_bytes = args.page_kib << 10
    result = best([throughput_round(url, r, args.blocks, page_bytes, args.batch) for r in range(args.repeat)])
    size = args.blocks * page_bytes / 2**20
    print(
        f"{args.blocks} blocks of {args.page_kib} KiB ({size:.0f} MiB), {args.batch} per call, best of {args.repeat}\n"
    )
    print("| | RedisBlockStore (ms) | plain pipelined SET NX / MGET (ms) | x | RedisBlockStore MiB/s |")
    print("|---|---|---|---|---|")
    names = (("put", "raw_put"), ("get", "raw_get"), ("get, a window after the put", "raw_get"))
    for (name, raw), key in zip(names, ("put", "get", "get_late"), strict=True):
        print(
            f"| {name} | {result[key] * 1e3:.1f} | {result[raw] * 1e3:.1f} | {result[key] / result[raw]:.2f} "
            f"| {size / result[key]:.0f} |"
        )


class NullStore(kv_api.BlockStore):
    """Has nothing and keeps nothing: what the manager's own side of a remote tier costs (values
    encoded and handed over, lookups asked), without a client or a network."""

    def contains(self, keys: Sequence[bytes]) -> int:
        return 0

    def get_into(self, keys: Sequence[bytes], buffers: Sequence[memoryview]) -> int:
        return 0

    def put(self, keys: Sequence[bytes], values: Sequence[bytes]) -> None:
        pass

    def close(self) -> None:
        pass


def cpu_seconds(pid: int, thread: int | None = None) -> float:
    """User + system CPU of a process, or of one of its threads (Linux ``/proc``)."""
    path = f"/proc/{pid}/task/{thread}/stat" if thread is not None else f"/proc/{pid}/stat"
    with open(path) as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class BlockCosts:
    """Where a block written through ``RedisBlockStore`` goes, per block over a run: the put call
    on the engine's thread, the writer thread's CPU (holding the GIL for much of it) and the
    server's CPU (on this machine, the same cores)."""

    def __init__(self, store: RedisBlockStore, server_pid: int) -> None:
        self.store, self.server_pid = store, server_pid
        self.writer = store._writer._thread.native_id
        self.start = self._now()

    def _now(self) -> tuple[float, float, float, int]:
        stats = self.store.stats()
        writer = cpu_seconds(os.getpid(), self.writer)
        return stats.call_seconds, writer, cpu_seconds(self.server_pid), stats.written

    def line(self) -> str:
        assert self.store.flush(60)
        end = self._now()
        calls, writer, server, written = (b - a for a, b in zip(self.start, end, strict=True))
        size = self.store.stats().bytes_written / max(1, self.store.stats().written) / 1024
        return (
            f"RedisBlockStore, per block written through ({written:,} blocks of {size:.0f} KiB, the whole run): "
            f"store calls {calls / written * 1e6:.1f} us on the engine's thread, writer thread "
            f"{writer / written * 1e6:.1f} us CPU, server {server / written * 1e6:.1f} us CPU"
        )


def attached(server: ValkeyServer, args: argparse.Namespace) -> None:
    """bench_manager's figures with a remote tier attached (on ``NullStore``, and on the server
    through ``RedisBlockStore``), against without."""
    import redis

    url = server.url
    costs: list[str] = []
    tokens = np.random.default_rng(0).integers(0, 2**31, args.tokens, dtype=np.int32)
    print("\n| backend | figure | no remote tier | NullStore | x | RedisBlockStore | x |")
    print("|---|---|---|---|---|---|---|")
    for name in args.backend or kv_api.available_backends():
        backend = kv_api.load_backend(name)
        stores: list[Callable[[], contextlib.AbstractContextManager[kv_api.BlockStore | None]]] = [
            lambda: contextlib.nullcontext(None),
            lambda: contextlib.nullcontext(NullStore()),
            lambda: RedisBlockStore(url, timeout=5),
        ]
        rounds: list[list[dict[str, float]]] = [[], [], []]
        # each side twice, the second time in reverse order: the machine's drift falls on all three
        for side in [0, 1, 2, 2, 1, 0]:
            with redis.Redis.from_url(url) as client:
                client.flushall()  # another run's blocks would be found
            with stores[side]() as remote:
                cost = BlockCosts(remote, server.pid or 0) if isinstance(remote, RedisBlockStore) else None
                one = measure_manager(backend, tokens, TOKENS_PER_BLOCK, args.repeat, args.steps, remote=remote)
                many = iteration(backend, args.running, TOKENS_PER_BLOCK, args.repeat, args.iterations, remote=remote)
                one["iteration"] = many["batched"]
                if cost is not None:
                    costs.append(f"{name}: {cost.line()}")
                    assert cast(RedisBlockStore, remote).stats().errors == 0
            rounds[side].append(one)
        figures = [best(r) for r in rounds]
        rows = [
            ("decode step, one cache (us)", "decode", 1e6),
            (f"decode iteration, {args.running} caches batched (us)", "iteration", 1e6),
            (f"cold admission, {len(tokens):,} tokens (ms)", "cold", 1e3),
            ("cached admission (ms)", "cached", 1e3),
        ]
        for label, key, unit in rows:
            plain, null, real = (f[key] for f in figures)
            print(
                f"| {name} | {label} | {plain * unit:.2f} | {null * unit:.2f} | {null / plain:.2f} "
                f"| {real * unit:.2f} | {real / plain:.2f} |"
            )
    print()
    for line in costs:
        print(f"- {line}")


def replay(*flags: str) -> tuple[dict[str, Any], float, str]:
    """``kvcore replay mooncake-synthetic FLAGS --json --quiet``: its report, wall time and command."""
    kvcore = os.path.join(os.path.dirname(sys.executable), "kvcore")
    command = [kvcore if os.path.exists(kvcore) else "kvcore", "replay", "mooncake-synthetic", *flags]
    start = time.perf_counter()
    done = subprocess.run([*command, "--json", "--quiet"], check=True, capture_output=True, text=True)
    return json.loads(done.stdout), time.perf_counter() - start, "kvcore " + " ".join(command[1:])


def fleet(args: argparse.Namespace) -> None:
    """``kvcore replay`` on ``--instances`` managers, without the shared store then with it
    (one command), and one instance with a pool holding the whole trace: the most reuse there is."""
    # bench_replay_vs_mocker's geometry: 8,192 blocks of 32 tokens per instance in 2 MiB.
    model = ["--limit", str(args.limit), "--layers", "1", "--bytes-per-token", "4"]
    report, wall, command = replay(*model, "--quota", "2M", "--instances", str(args.instances), "--remote", "valkey")
    whole, _, whole_command = replay(*model, "--quota", "1G")
    remote = report["remote"]
    print(f"\n`{command}` ({wall:.1f} s; both cluster replays)\n")
    print(
        "| cluster hit rate without the store | with it | one instance, unbounded pool "
        "| blocks from the store | written | dropped by the store | store call (mean) |"
    )
    print("|---|---|---|---|---|---|---|")
    print(
        f"| {report['hit_rate_without_store']:.2%} | {report['hit_rate']:.2%} | {whole['hit_rate']:.2%} "
        f"| {remote['blocks']:,} | {remote['written']:,} | {remote['store_dropped']:,} "
        f"| {remote['store_call_us']:.0f} us |"
    )
    print(f"\n(the unbounded pool: `{whole_command}`)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=4096, help="blocks per throughput round (default: 4096)")
    parser.add_argument("--page-kib", type=int, default=64, help="KiB of payload per block (default: 64)")
    parser.add_argument("--batch", type=int, default=64, help="blocks per put / get call (default: 64)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=100_000, help="prompt length of the admission figures")
    parser.add_argument("--steps", type=int, default=2000, help="decode steps per round")
    parser.add_argument("--running", type=int, default=256, help="caches of the decode iteration (default: 256)")
    parser.add_argument("--iterations", type=int, default=200, help="decode iterations per round")
    parser.add_argument("--backend", action="append", help="backends to measure (default: every installed one)")
    parser.add_argument("--limit", type=int, default=1000, help="requests of the fleet replay (default: 1000)")
    parser.add_argument("--instances", type=int, default=4)
    args = parser.parse_args()
    with ValkeyServer() as server:
        throughput(server.url, args)
        attached(server, args)
    fleet(args)


if __name__ == "__main__":
    main()
