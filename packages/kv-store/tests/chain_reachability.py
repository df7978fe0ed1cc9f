"""How much of what a Valkey at ``maxmemory`` keeps is still usable: the fraction of stored value
bytes whose whole chain prefix (every block before them) is stored too. A manager reads a chain
from its first block and stops at the first miss, so a block past a hole is memory spent for
nothing.

A fleet of managers (each with a small local cache of blocks) serves conversations on a dozen
shared system prompts against one server with ``allkeys-lru``, writing several times
``maxmemory`` in all, paced (the server's LRU clock counts seconds, so what matters is how many
seconds of writes the server holds, ``history_s``). The same seeded workload runs with the naive
order (``order_chains=False``: each put head first, the server's eviction alone) and with
``RedisBlockStore``'s (its chain-aware LRU index, tail-first writes, no orphan writes).

    python packages/kv-store/tests/chain_reachability.py [--history 6] [--passes 3]
"""

from __future__ import annotations

import argparse
import hashlib
import random
import time
from collections import OrderedDict
from dataclasses import dataclass

import redis

from kv_api.block_value import encode_value, header_size, read_place
from kv_store.redis_block_store import RedisBlockStore
from kv_store.valkey_server import ValkeyServer

NAMESPACE = b"kvcore:chain-test@0:0123456789abcdef:"
ROOT = bytes(32)  # the scope's root key: every chain's first block's parent
TOKENS = 16
FINGERPRINT = hashlib.sha256(b"chain-test").digest()


@dataclass(frozen=True)
class Workload:
    maxmemory: int = 16 << 20
    value_size: int = 16 << 10
    history_s: float = 6.0  # seconds of writes the server holds
    passes: float = 3.0  # bytes written / maxmemory
    managers: int = 4
    local_blocks: int = 96  # each manager's own cache, in blocks
    system_prompts: int = 12
    system_blocks: int = 6
    active: int = 48  # conversations going on at once
    seed: int = 1


@dataclass(frozen=True)
class Result:
    reachable: float  # the fraction of stored value bytes reachable from their chain's first block
    stored_blocks: int
    written_bytes: int
    hit_blocks: int  # blocks managers read from the store
    seconds: float
    server_evicted: int  # keys the server's own eviction removed
    store_evicted: int  # blocks the stores' LRU index removed
    dropped: int  # blocks put but not written (orphans, queue full)


class _Chains:
    """Block keys and values of the workload: a key is a hash of its parent and its index."""

    def __init__(self, value_size: int) -> None:
        self.page = random.Random(0).randbytes(value_size - header_size(1))
        self.size = value_size
        self.parents: dict[bytes, tuple[bytes, int]] = {}

    def extend(self, chain: list[bytes], blocks: int, salt: bytes) -> list[bytes]:
        out = list(chain)
        for _ in range(blocks):
            parent = out[-1] if out else ROOT
            key = hashlib.sha256(parent + salt + len(out).to_bytes(4, "little")).digest()
            self.parents[key] = (parent, len(out) + 1)
            out.append(key)
        return out

    def value(self, key: bytes) -> bytes:
        parent, depth = self.parents[key]
        return encode_value(FINGERPRINT, key, parent, depth * TOKENS, TOKENS, [self.page], [len(self.page)])


class _Manager:
    def __init__(self, store: RedisBlockStore, chains: _Chains, local_blocks: int) -> None:
        self.store, self.chains, self.capacity = store, chains, local_blocks
        self.local: OrderedDict[bytes, None] = OrderedDict()
        self.hits = 0

    def serve(self, prompt: list[bytes], chain: list[bytes]) -> None:
        """A request: ``prompt`` (a prefix of ``chain``) from cache or store, the rest computed."""
        have = 0
        while have < len(prompt) and prompt[have] in self.local:
            have += 1
        got = 0
        if have < len(prompt):
            keys = [NAMESPACE + k for k in prompt[have:]]
            found = self.store.contains(keys)
            buffers = [memoryview(bytearray(self.chains.size)) for _ in range(found)]
            got = self.store.get_into(keys[:found], buffers)
            self.hits += got
        new = chain[have + got :]
        if new:
            self.store.put([NAMESPACE + k for k in new], [self.chains.value(k) for k in new])
        for key in chain:
            self.local[key] = None
            self.local.move_to_end(key)
        while len(self.local) > self.capacity:
            self.local.popitem(last=False)


def _drive(workload: Workload, stores: list[RedisBlockStore]) -> tuple[int, int]:
    """Runs the requests, paced to ``maxmemory / history_s`` bytes a second; returns (bytes
    handed to put, blocks read from the store)."""
    rng = random.Random(workload.seed)
    chains = _Chains(workload.value_size)
    managers = [_Manager(s, chains, workload.local_blocks) for s in stores]
    systems = [chains.extend([], workload.system_blocks, bytes([i])) for i in range(workload.system_prompts)]
    weights = [1.0 / (i + 1) for i in range(len(systems))]  # a few prompts are most of the traffic
    conversations: list[tuple[list[bytes], int]] = []  # (chain, turns left)
    rate = workload.maxmemory / workload.history_s
    total = workload.maxmemory * workload.passes
    written, start, serial = 0, time.monotonic(), 0
    while written < total:
        if len(conversations) < workload.active:
            system = rng.choices(systems, weights)[0]
            conversations.append((system, rng.randint(1, 8)))
        i = rng.randrange(len(conversations))
        chain, turns = conversations[i]
        serial += 1
        prompt = chains.extend(chain, rng.randint(1, 3), serial.to_bytes(8, "little"))  # the user's message
        answer = chains.extend(prompt, rng.randint(1, 6), b"a")  # what the model generated
        manager = managers[rng.randrange(len(managers))]
        before = sum(s.stats().puts for s in stores)
        manager.serve(prompt, answer)
        written += (sum(s.stats().puts for s in stores) - before) * workload.value_size
        conversations[i] = (answer, turns - 1)
        if turns <= 1:
            conversations.pop(i)
        ahead = written / rate - (time.monotonic() - start)
        if ahead > 0:
            time.sleep(ahead)
    return written, sum(m.hits for m in managers)


def measure_stored(client: redis.Redis, namespace: bytes = NAMESPACE) -> tuple[float, int]:
    """(fraction of stored value bytes reachable from their chain's first block, blocks stored),
    from the headers on the server (``read_place``: each value names its parent)."""
    keys = [k for k in client.scan_iter(match=namespace + b"*", count=1000)]
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.getrange(key, 0, 119)  # the fixed fields: key, parent, depth, tokens, groups
        pipe.strlen(key)
    replies = pipe.execute()
    sizes: dict[bytes, int] = {}
    parents: dict[bytes, bytes] = {}
    for head, size in zip(replies[0::2], replies[1::2], strict=True):
        place = read_place(head)
        if place is not None:
            sizes[place[0]], parents[place[0]] = size, place[1]
    reachable: dict[bytes, bool] = {ROOT: True}

    def is_reachable(key: bytes) -> bool:
        path = []
        while key not in reachable:
            if key not in parents:
                reachable[key] = False
                break
            path.append(key)
            key = parents[key]
        answer = reachable[key]
        for k in path:
            reachable[k] = answer
        return answer

    good = sum(size for key, size in sizes.items() if is_reachable(key))
    return (good / sum(sizes.values()) if sizes else 1.0), len(sizes)


def run(workload: Workload, *, order_chains: bool) -> Result:
    """One run against a fresh server."""
    with ValkeyServer(maxmemory=workload.maxmemory, maxmemory_policy="allkeys-lru") as server:
        stores = [RedisBlockStore(server.url, timeout=5.0, order_chains=order_chains) for _ in range(workload.managers)]
        start = time.monotonic()
        written, hits = _drive(workload, stores)
        for store in stores:
            store.close()
        seconds = time.monotonic() - start
        client = redis.Redis.from_url(server.url)
        server_evicted = int(client.info("stats")["evicted_keys"])
        fraction, blocks = measure_stored(client)
        client.close()
    stats = [s.stats() for s in stores]
    return Result(
        fraction, blocks, written, hits, seconds, server_evicted,
        sum(s.evicted for s in stats), sum(s.dropped for s in stats),
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--history", type=float, default=Workload.history_s, help="seconds of writes held")
    parser.add_argument("--passes", type=float, default=Workload.passes, help="bytes written / maxmemory")
    parser.add_argument("--maxmemory-mb", type=int, default=Workload.maxmemory >> 20)
    parser.add_argument("--value-kb", type=int, default=Workload.value_size >> 10)
    parser.add_argument("--managers", type=int, default=Workload.managers)
    parser.add_argument("--seed", type=int, default=Workload.seed)
    args = parser.parse_args()
    workload = Workload(
        maxmemory=args.maxmemory_mb << 20,
        value_size=args.value_kb << 10,
        history_s=args.history,
        passes=args.passes,
        managers=args.managers,
        seed=args.seed,
    )
    print(workload)
    for name, order in (("naive (head first, no touch)", False), ("RedisBlockStore order", True)):
        r = run(workload, order_chains=order)
        print(
            f"{name:30} reachable {r.reachable:.3f} of {r.stored_blocks} stored blocks; "
            f"written {r.written_bytes / workload.maxmemory:.1f}x maxmemory in {r.seconds:.1f} s, "
            f"{r.hit_blocks} blocks read from the store; evicted by the server {r.server_evicted}, "
            f"by the stores {r.store_evicted}; dropped {r.dropped}"
        )


if __name__ == "__main__":
    main()
