"""Store benchmark (issue 26): the remote tier's store and what attaching it costs, side by side in
one run, on a real ``valkey-server`` started for the run (``kv_store.ValkeyServer``).

- Throughput: a chain of block values (real headers, so the chain-aware LRU does its work) put
  through ``RedisBlockStore`` (``put`` per batch, then ``flush`` until the server has them all)
  and read back with ``get_into``, against plain pipelined ``SET NX`` / ``MGET`` of the same bytes
  in the same batches with the same ``redis`` client. Each round writes fresh keys.
- The decode step and the cold / cached admission of bench_manager with a remote tier on that
  server attached, against without, per backend (a decode step writes a block through every
  ``tokens_per_block`` steps; a cold admission asks the store once).
- A fleet: ``kvcore replay`` of the Mooncake synthetic trace on ``--instances`` managers, the
  cluster hit rate with the shared store (``--remote valkey``) against without it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
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
    with RedisBlockStore(url, client=client, timeout=5, max_pending_bytes=4 * blocks * len(values[0])) as store:

        def put() -> None:
            for part in parts:
                store.put(keys[part], values[part])
            assert store.flush(60)

        def get() -> None:
            for part in parts:
                assert store.get_into(keys[part], buffers[part]) == part.stop - part.start

        out["put"] = timed(put)
        out["get"] = timed(get)
        assert store.flush(60)
        stats = store.stats()
        assert stats.written == blocks and stats.dropped == 0, stats

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

    out["raw_put"] = timed(raw_put)
    out["raw_get"] = timed(raw_get)
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
    for name, raw in (("put", "raw_put"), ("get", "raw_get")):
        print(
            f"| {name} | {result[name] * 1e3:.1f} | {result[raw] * 1e3:.1f} | {result[name] / result[raw]:.2f} "
            f"| {size / result[name]:.0f} |"
        )


def attached(url: str, args: argparse.Namespace) -> None:
    """bench_manager's figures with the remote tier on the server, against without."""
    tokens = np.random.default_rng(0).integers(0, 2**31, args.tokens, dtype=np.int32)
    print(
        "\n| backend | decode step (us), no remote | with remote | x "
        "| cold admission (ms), no remote | with remote | x | cached admission (ms), no remote | with remote | x |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in args.backend or kv_api.available_backends():
        backend = kv_api.load_backend(name)
        plain = measure_manager(backend, tokens, TOKENS_PER_BLOCK, args.repeat, args.steps)
        with RedisBlockStore(url, timeout=5) as store:
            remote = measure_manager(backend, tokens, TOKENS_PER_BLOCK, args.repeat, args.steps, remote=store)
            assert store.flush(60) and store.stats().errors == 0
        cells = [
            f"{plain['decode'] * 1e6:.2f} | {remote['decode'] * 1e6:.2f} | {remote['decode'] / plain['decode']:.2f}",
            f"{plain['cold'] * 1e3:.2f} | {remote['cold'] * 1e3:.2f} | {remote['cold'] / plain['cold']:.2f}",
            f"{plain['cached'] * 1e3:.2f} | {remote['cached'] * 1e3:.2f} | {remote['cached'] / plain['cached']:.2f}",
        ]
        print(f"| {name} | " + " | ".join(cells) + " |")


def fleet(args: argparse.Namespace) -> None:
    """``kvcore replay`` on ``--instances`` managers, with and without the shared store."""
    kvcore = os.path.join(os.path.dirname(sys.executable), "kvcore")
    command = [
        kvcore if os.path.exists(kvcore) else "kvcore",
        "replay",
        "mooncake-synthetic",
        "--limit",
        str(args.limit),
        "--instances",
        str(args.instances),
        "--quota",
        args.quota,
        "--remote",
        "valkey",
        "--json",
        "--quiet",
    ]
    start = time.perf_counter()
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - start
    report: dict[str, Any] = json.loads(done.stdout)
    remote = report["remote"]
    print(f"\n`kvcore {' '.join(command[1:])}` ({wall:.1f} s)\n")
    print("| cluster hit rate without the store | with it | blocks from the store | written | dropped by the store |")
    print("|---|---|---|---|---|")
    print(
        f"| {report['hit_rate_without_store']:.2%} | {report['hit_rate']:.2%} | {remote['blocks']:,} "
        f"| {remote['written']:,} | {remote['store_dropped']:,} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=4096, help="blocks per throughput round (default: 4096)")
    parser.add_argument("--page-kib", type=int, default=64, help="KiB of payload per block (default: 64)")
    parser.add_argument("--batch", type=int, default=64, help="blocks per put / get call (default: 64)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=100_000, help="prompt length of the admission figures")
    parser.add_argument("--steps", type=int, default=2000, help="decode steps per round")
    parser.add_argument("--backend", action="append", help="backends to measure (default: every installed one)")
    parser.add_argument("--limit", type=int, default=1000, help="requests of the fleet replay (default: 1000)")
    parser.add_argument("--instances", type=int, default=4)
    parser.add_argument("--quota", default="1G", help="each instance's device quota in the fleet replay")
    args = parser.parse_args()
    with ValkeyServer() as server:
        throughput(server.url, args)
        attached(server.url, args)
    fleet(args)


if __name__ == "__main__":
    main()
