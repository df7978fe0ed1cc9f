"""vLLM's v1 ``KVCacheManager`` behind the calls kvcore's replay makes (issue 27, item 3).

``bench_peers.py`` drives both managers with one engine loop, ``kv_replay.replayer.Replayer``:
the same admission order, the same preemption rule (the newest open request makes room), the
same decode step. This module is the thin layer that lets the loop call vLLM: a duck-typed
backend whose manager and caches answer the loop's calls with vLLM's own, the way vLLM's
scheduler makes them:

- ``create_kv_cache`` builds a ``vllm.v1.request.Request`` with vLLM's block hasher, which
  hashes the prompt's full blocks as vLLM's engine does when a request arrives;
- ``resume`` is ``get_computed_blocks`` (the prefix lookup the scheduler makes at each try);
- the first ``resize`` is ``allocate_slots`` for the prompt's uncached tokens with the hit's
  blocks, a later one ``allocate_slots`` for the step's new token; ``None`` (no room) is False;
- ``commit`` advances ``num_computed_tokens``; a decoded token is first appended with
  ``append_output_token_ids`` (which hashes a block it fills, as vLLM does after sampling), and a
  block it fills is cached at once (``cache_blocks``: vLLM's next ``allocate_slots`` would);
- ``close`` is ``free``: the request's blocks stay cached, as a finished or preempted request's do.

vLLM keeps block 0 as its null block: its pool gets one block more than kvcore's slots, so both
hold the same number of usable blocks. vLLM is imported when a peer is built (it is installed only
by ``nox -s bench_peers``); its modules are untyped here.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import time
from types import SimpleNamespace
from typing import Any

import numpy as np

from kv_api import KVCacheManagerConfig, StorageStatistics

HASHES = ("sha256", "sha256_cbor")  # vLLM's default (pickle then SHA-256), and its CBOR variant


def load_vllm() -> SimpleNamespace:
    """The vLLM modules the peer uses; ImportError (with vLLM's message) where it is missing."""
    names = {
        "manager": "vllm.v1.core.kv_cache_manager",
        "utils": "vllm.v1.core.kv_cache_utils",
        "interface": "vllm.v1.kv_cache_interface",
        "request": "vllm.v1.request",
        "sampling": "vllm.sampling_params",
        "hashing": "vllm.utils.hashing",
        "torch": "torch",
    }
    return SimpleNamespace(**{short: importlib.import_module(name) for short, name in names.items()})


class VllmPeer:
    """A backend for ``Replayer``: ``KVCacheManager(config, event_manager, page_copier)`` builds a
    ``VllmManager`` of ``blocks`` usable blocks hashing with vLLM's ``hash_name`` function."""

    name = "vllm"
    capabilities = SimpleNamespace(batched_calls=False)  # the loop calls each cache in turn

    def __init__(self, blocks: int, hash_name: str = "sha256") -> None:
        if hash_name not in HASHES:
            raise ValueError(f"hash must be one of {', '.join(HASHES)}, not {hash_name!r}")
        self.vllm = load_vllm()
        self.blocks = blocks
        self.hash_fn = self.vllm.hashing.get_hash_fn_by_name(hash_name)
        self.vllm.utils.init_none_hash(self.hash_fn)
        self.KVCacheManager = functools.partial(VllmManager, self)

    def hasher(self, tokens_per_block: int) -> Any:
        """vLLM's per-request block hasher (what its engine gives every request)."""
        return self.vllm.utils.get_request_block_hasher(tokens_per_block, self.hash_fn)


class VllmManager:
    def __init__(
        self, peer: VllmPeer, config: KVCacheManagerConfig, event_manager: object, page_copier: object
    ) -> None:
        if event_manager is not None or page_copier is not None or len(config.cache_tiers) > 1:
            raise ValueError("the vLLM peer has one device level, no events and no page copier")
        v = peer.vllm
        block = config.tokens_per_block
        # The spec's shape only sizes vLLM's pages (no tensors are allocated): the manager's work
        # depends on the block count and size.
        spec = v.interface.FullAttentionSpec(block_size=block, num_kv_heads=1, head_size=1, dtype=v.torch.float16)
        group = v.interface.KVCacheGroupSpec(["layer.0"], spec)
        kv_config = v.interface.KVCacheConfig(num_blocks=peer.blocks + 1, kv_cache_tensors=[], kv_cache_groups=[group])
        self.inner = v.manager.KVCacheManager(
            kv_config, max_model_len=1 << 24, scheduler_block_size=block, hash_block_size=block, enable_caching=True
        )
        self.blocks = peer.blocks
        self.block_size = block
        self.make_request = functools.partial(
            v.request.Request,
            sampling_params=v.sampling.SamplingParams(max_tokens=1),
            pooling_params=None,
            block_hasher=peer.hasher(block),
        )
        self.ids = itertools.count()
        # The loop hands prompts over as numpy arrays; vLLM takes lists. The conversion is the
        # harness's work, not vLLM's: its time is kept here and taken off the manager's.
        self.harness_seconds = 0.0

    def create_kv_cache(self, scope: object, tokens: np.ndarray[Any, Any]) -> VllmCache:
        start = time.perf_counter()
        ids = tokens.tolist()
        self.harness_seconds += time.perf_counter() - start
        return VllmCache(self.inner, self.make_request(str(next(self.ids)), ids), self.block_size)

    def get_storage_statistics(self, level: int = 0) -> list[StorageStatistics]:
        # vLLM's free queue holds its cached blocks too: all of it is what kvcore calls available.
        return [StorageStatistics(self.blocks, self.inner.block_pool.get_num_free_blocks(), 0)]

    def get_committed_stats(self) -> SimpleNamespace:
        return SimpleNamespace(evicted_pages=0)  # not counted by vLLM's manager without its stats

    def shutdown(self) -> None:
        pass


class VllmCache:
    """One request's cache, as the loop sees it (see the module's docstring for the mapping)."""

    __slots__ = ("block_size", "blocks", "hit", "inner", "request", "started")

    def __init__(self, inner: Any, request: Any, block_size: int) -> None:
        self.inner = inner
        self.block_size = block_size
        self.request = request
        self.blocks: Any = None
        self.hit = 0
        self.started = False

    @property
    def num_committed_tokens(self) -> int:
        return int(self.request.num_computed_tokens) if self.started else self.hit

    @property
    def cached_tokens_by_level(self) -> list[int]:
        return [self.num_committed_tokens]

    def resume(self) -> bool:
        self.blocks, self.hit, _ = self.inner.get_computed_blocks(self.request)
        return True

    def suspend(self) -> None:
        self.blocks = None

    def resize(self, capacity: int) -> bool:
        request = self.request
        if self.started:
            return self.inner.allocate_slots(request, capacity - request.num_computed_tokens) is not None
        if self.inner.allocate_slots(request, capacity - self.hit, self.hit, self.blocks) is None:
            return False
        self.started = True
        self.blocks = None
        request.num_computed_tokens = self.hit
        return True

    def commit(self, tokens: Any) -> None:
        request = self.request
        count = len(tokens)
        if request.num_computed_tokens + count <= request.num_tokens:  # the prompt's (prefill)
            request.num_computed_tokens += count
            return
        request.append_output_token_ids(tokens)  # decoded (a list of ints): vLLM appends it first
        request.num_computed_tokens += count
        if request.num_computed_tokens % self.block_size == 0:
            # The block just filled is cached now, as kvcore's commit does: vLLM's next
            # allocate_slots would, but a request that ends here would never reach it.
            self.inner.cache_blocks(request, request.num_computed_tokens)

    def close(self) -> None:
        self.inner.free(self.request)
