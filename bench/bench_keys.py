"""Block-key benchmark: ns/token per backend, container and format, next to the SHA-256 limit.

The limit is measured in the same run: hashlib over one large buffer gives ns per 64-byte
compression, multiplied by the compressions the keys need (a key hashes 32 + tokens bytes,
padded). Ratios are what to compare across machines; absolute times drift.
"""

from __future__ import annotations

import argparse
import hashlib
import time
from array import array
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import Any

import numpy as np

import kv_api

N_TOKENS = 1 << 20


def best_of(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def ns_per_compression(repeat: int) -> float:
    data = bytes(64 << 20)
    return best_of(lambda: hashlib.sha256(data).digest(), repeat) / (len(data) // 64) * 1e9


def compressions(n_tokens: int, tokens_per_block: int, width: int) -> int:
    """SHA-256 compressions for the root and every block key."""
    total = 1  # the root: one byte of scope, padded to one block
    for start in range(0, n_tokens, tokens_per_block):
        message = 32 + min(tokens_per_block, n_tokens - start) * width
        total += (message + 9 + 63) // 64
    return total


def containers(ids: np.ndarray[Any, Any]) -> dict[str, Any]:
    return {
        "int32 buffer": ids.astype(np.int32),
        "int64 buffer": ids.astype(np.int64),
        "list": ids.tolist(),
        "array('i')": array("i", ids.astype(np.int32).tobytes()),
    }


def iterate(pairs: Iterable[object]) -> int:
    return sum(1 for _ in pairs)


def sequence(backend: kv_api.Backend, *args: Any) -> int:
    return iterate(backend.sequence_to_blockchain_keys(*args))


def reference_pairs(tokens_per_block: int, tokens: list[int]) -> Iterator[tuple[list[int], bytes]]:
    """The reference system's pure-Python sequence_to_blockchain_keys, as fast as it can be
    written: a generator (as the reference's is) that slices the caller's list per block and
    hashes parent key + the slice packed as u32. The reference also takes digest tokens, so its
    own packing looks at each token's type; packing ints only can only make this one faster."""
    key = hashlib.sha256(b"\x00").digest()
    yield [], key
    for i in range(0, len(tokens), tokens_per_block):
        chunk = tokens[i : i + tokens_per_block]
        key = hashlib.sha256(key + array("I", chunk).tobytes()).digest()
        yield chunk, key


def separate_calls(backend: kv_api.Backend, batch: list[Any]) -> list[bytes]:
    return [backend.block_keys(32, None, t) for t in batch]


def interleaved(per_compression: float, repeat: int, prompts: int = 64, tokens: int = 4096) -> None:
    """Issue 14's figure: a batch of independent prompts (u32 int32 buffers, tpb 32) through
    block_keys_many, as aggregate throughput over the single-stream SHA-256 limit measured in this
    run (> 1 means faster than one stream can go), and against one block_keys call per prompt."""
    rng = np.random.default_rng(1)
    batch = [rng.integers(0, 2**31, tokens, dtype=np.int32) for _ in range(prompts)]
    limit = prompts * compressions(tokens, 32, 4) * per_compression
    print(f"\nInterleaved hashing: {prompts} prompts x {tokens} tokens (u32 int32 buffers, tpb 32):")
    print("| backend | route | ms | throughput / single-stream limit | many vs separate calls |")
    print("|---|---|---|---|---|")
    for name in kv_api.available_backends():
        backend = kv_api.load_backend(name)
        many = best_of(partial(backend.block_keys_many, 32, None, batch), repeat)
        separate = best_of(partial(separate_calls, backend, batch), repeat)
        print(f"| {name} | block_keys_many | {many * 1e3:.3f} | {limit * 1e-9 / many:.2f} | {separate / many:.2f}x |")
        print(f"| {name} | {prompts} x block_keys | {separate * 1e3:.3f} | {limit * 1e-9 / separate:.2f} | |")


def lists(per_compression: float, n_tokens: int, repeat: int) -> None:
    """Issue 14's list-ingestion figures: block_keys from a list of ints (u32, tpb 32) over the
    SHA-256 limit, and sequence_to_blockchain_keys on a list against the reference's generator,
    both iterated alike, from a short prompt to ``n_tokens``."""
    ids = np.random.default_rng(0).integers(0, 2**31, n_tokens, dtype=np.int64)
    as_list = [int(i) for i in ids]
    limit = compressions(n_tokens, 32, 4) * per_compression
    backends = {name: kv_api.load_backend(name) for name in kv_api.available_backends()}
    print(f"\nList ingestion: {n_tokens} tokens in a list of ints (u32, tpb 32):")
    print("| backend | block_keys ns/token | x limit |")
    print("|---|---|---|")
    for name, backend in backends.items():
        keys = best_of(partial(backend.block_keys, 32, None, as_list), repeat)
        print(f"| {name} | {keys / n_tokens * 1e9:.2f} | {keys * 1e9 / limit:.2f} |")
    print("\nsequence_to_blockchain_keys on a list (u32, tpb 32), iterated, against the reference's generator:")
    print("| tokens | reference ns/token | " + " | ".join(f"{name} vs reference" for name in backends) + " |")
    print("|---|---|" + "---|" * len(backends))
    for n in sorted({4096, 65536, n_tokens}):
        part = as_list[:n]
        # Enough calls per timing that a short list is not timed by the clock's resolution.
        calls = max(1, 65536 // n)

        def timed(make: Callable[[], Iterable[object]], calls: int = calls) -> float:
            return best_of(lambda: [iterate(make()) for _ in range(calls)], repeat) / calls

        reference = timed(partial(reference_pairs, 32, part))
        ratios = [
            timed(partial(backend.sequence_to_blockchain_keys, 32, None, part)) / reference
            for backend in backends.values()
        ]
        print(f"| {n} | {reference / n * 1e9:.2f} | " + " | ".join(f"{r:.2f}x" for r in ratios) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=N_TOKENS)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--interleaved-only", action="store_true", help="only the block_keys_many figure")
    parser.add_argument("--lists-only", action="store_true", help="only the list-ingestion figures")
    args = parser.parse_args()
    if args.lists_only:
        per_compression = ns_per_compression(args.repeat)
        print(f"SHA-256 limit: {per_compression:.1f} ns per 64-byte compression (hashlib, one large buffer)")
        lists(per_compression, args.tokens, args.repeat)
        return
    if args.interleaved_only:
        per_compression = ns_per_compression(args.repeat)
        print(f"SHA-256 limit: {per_compression:.1f} ns per 64-byte compression (hashlib, one large buffer)")
        interleaved(per_compression, max(args.repeat, 20))
        return
    ids = np.random.default_rng(0).integers(0, 2**31, args.tokens, dtype=np.int64)
    per_compression = ns_per_compression(args.repeat)
    print(f"SHA-256 limit: {per_compression:.1f} ns per 64-byte compression (hashlib, one large buffer)")
    print(f"{args.tokens} tokens; ratio = time / (compressions x limit)\n")
    print("| backend | function | format | tpb | input | ns/token | x limit |")
    print("|---|---|---|---|---|---|---|")
    for name in kv_api.available_backends():
        backend = kv_api.load_backend(name)
        for key_format, width in (("sha256-u32", 4), ("sha256-u64", 8)):
            for tokens_per_block in (32, 64):
                limit = compressions(args.tokens, tokens_per_block, width) * per_compression
                for label, tokens in containers(ids).items():
                    runs: list[tuple[str, Callable[[], object]]] = [
                        ("block_keys", partial(backend.block_keys, tokens_per_block, None, tokens, key_format))
                    ]
                    if label == "int32 buffer":
                        runs.append(
                            ("sequence", partial(sequence, backend, tokens_per_block, None, tokens, key_format))
                        )
                    for fn_name, fn in runs:
                        seconds = best_of(fn, args.repeat)
                        print(
                            f"| {name} | {fn_name} | {key_format} | {tokens_per_block} | {label} | "
                            f"{seconds / args.tokens * 1e9:.2f} | {seconds * 1e9 / limit:.2f} |"
                        )
    interleaved(per_compression, max(args.repeat, 20))
    lists(per_compression, args.tokens, args.repeat)


if __name__ == "__main__":
    main()
