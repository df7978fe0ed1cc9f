"""The reference engine: continuous batching over kvcore, one forward per request per step.

Each step admits waiting requests (``admit_many``/``create_kv_cache`` match what is not
recomputed, then ``resume``), then runs every running request once: a prefill chunk (block-aligned) or one decode
token, after ``resize`` made room (preempting the youngest request when pages run out), and
commits the requests whose block filled. A finished request commits what it computed and
closes. Decoding is greedy. docs/engine.md walks through the calls.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from collections.abc import Sequence as Seq
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

import kv_api
from kv_engine.layout import ModelLayout, PageViews, model_layout
from kv_engine.paged_cache import PagedCache
from kv_engine.sequence import Output, Sequence

DEFAULT_DEVICE_QUOTA = 64 << 20


@dataclass
class EngineStats:
    """Counters since the engine was built. ``computed_tokens``: tokens forwarded (prefill and
    decode); ``reused_tokens``: prompt tokens taken from kvcore at admission; ``peak_blocks``:
    per attention layer group, the most pages one request had locked at a forward;
    ``forward_s``: seconds in the model's forwards; ``manager_s``: seconds in kvcore's calls
    (admission, resume, resize, commit, suspend, close, reading page indices)."""

    steps: int = 0
    forwards: int = 0
    computed_tokens: int = 0
    reused_tokens: int = 0
    preemptions: int = 0
    peak_blocks: dict[int, int] = field(default_factory=dict)
    forward_s: float = 0.0
    manager_s: float = 0.0


def _backend(backend: kv_api.Backend | str | None) -> kv_api.Backend:
    if backend is None:
        return kv_api.load_backend(kv_api.default_backend_name())
    return kv_api.load_backend(backend) if isinstance(backend, str) else backend


def _tiers(
    device_quota: int,
    host_quota: int | None,
    disk_quota: int | None,
    disk_path: str | os.PathLike[str] | None,
    remote: kv_api.RemoteCacheTierConfig | None = None,
) -> list[kv_api.CacheTierConfig]:
    tiers: list[kv_api.CacheTierConfig] = [kv_api.GpuCacheTierConfig(device_quota)]
    if host_quota is not None:
        tiers.append(kv_api.HostCacheTierConfig(host_quota))
    if (disk_quota is None) != (disk_path is None):
        raise ValueError("disk_quota and disk_path go together")
    if disk_quota is not None and disk_path is not None:
        tiers.append(kv_api.DiskCacheTierConfig(disk_quota, os.fspath(disk_path)))
    if remote is not None:
        tiers.append(remote)
    return tiers


class Engine:
    """A causal LM whose K/V (and Mamba states) live in a kvcore manager's pages.

    ``prefill_chunk`` (a multiple of ``tokens_per_block``; default one block for models with
    Mamba layers, so every block end gets a state snapshot, else 4 blocks) caps the tokens one
    prefill forward computes; ``max_running`` caps the requests in flight; ``keep_logits`` keeps
    each sampled token's logits in ``Output.logits``; ``reuse=False`` admits every request with
    nothing reused (the baseline reuse is measured against; blocks are still committed).
    ``remote``: a remote tier below the local ones (docs/store.md); its ``model_id`` and
    ``revision`` must name these weights and dtype, so no other model's K/V is ever read.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        backend: kv_api.Backend | str | None = None,
        tokens_per_block: int = 16,
        device_quota: int = DEFAULT_DEVICE_QUOTA,
        host_quota: int | None = None,
        disk_quota: int | None = None,
        disk_path: str | os.PathLike[str] | None = None,
        *,
        max_running: int = 8,
        prefill_chunk: int | None = None,
        keep_logits: bool = False,
        reuse: bool = True,
        remote: kv_api.RemoteCacheTierConfig | None = None,
    ) -> None:
        self.model = model
        self.backend = _backend(backend)
        self.layout: ModelLayout = model_layout(model, tokens_per_block)
        tiers = _tiers(device_quota, host_quota, disk_quota, disk_path, remote)
        self.manager = self.backend.KVCacheManager(self.layout.manager_config(tiers))
        self.views = PageViews(self.manager, self.layout)
        self.max_running = max_running
        self.prefill_chunk = prefill_chunk or tokens_per_block * (1 if self.layout.has_ssm else 4)
        if self.prefill_chunk % tokens_per_block:
            raise ValueError(f"prefill_chunk {self.prefill_chunk} is not a multiple of {tokens_per_block}")
        self.keep_logits = keep_logits
        self.reuse = reuse
        # Told each successful resume's latency and whether it brought pages up from a colder
        # level (a metrics exporter's histogram: kvcore engine --metrics-port).
        self.on_resume: Callable[[float, bool], None] | None = None
        self.stats = EngineStats()
        self._suspend_to_lower_level = len(tiers) - (remote is not None) > 1  # a local level below the device

    # -- public -------------------------------------------------------------------------------------

    def generate(
        self, prompts: Seq[Seq[int]], max_new_tokens: int = 16, scopes: Seq[kv_api.ReuseScope | None] | None = None
    ) -> list[Output]:
        """Greedy continuations of ``prompts`` (token-id lists), ``max_new_tokens`` each, under
        ``scopes`` (one per prompt; None: the default scope)."""
        if scopes is not None and len(scopes) != len(prompts):
            raise ValueError(f"scopes: {len(scopes)} for {len(prompts)} prompts")
        if any(len(p) == 0 for p in prompts):
            raise ValueError("prompts must not be empty")
        seqs = [
            Sequence(i, len(p), list(p), scopes[i] if scopes else None, max_new_tokens) for i, p in enumerate(prompts)
        ]
        waiting = deque(s for s in seqs if not s.finished)
        running: list[Sequence] = []
        self._start = time.perf_counter()
        while waiting or running:
            self._admit(waiting, running)
            self._step(waiting, running)
        return [s.output() for s in seqs]

    def resize_device(self, quota: int, best_efforts: bool = False) -> bool:
        """``manager.resize(GPU_LEVEL, quota)``, then the page views again if the pools moved
        (every forward checks ``layout_version`` too, so a resize or ``adjust()`` made on the
        manager directly is seen as well)."""
        ok = self.manager.resize(kv_api.GPU_LEVEL, quota, best_efforts)
        self.views.refresh()
        return ok

    def close(self) -> None:
        self.manager.shutdown()

    @contextmanager
    def _kvcore(self) -> Iterator[None]:
        """Times kvcore's calls (``stats.manager_s``)."""
        t = time.perf_counter()
        try:
            yield
        finally:
            self.stats.manager_s += time.perf_counter() - t

    # -- the loop ---------------------------------------------------------------------------------

    def _admit(self, waiting: deque[Sequence], running: list[Sequence]) -> None:
        room = self.max_running - len(running)
        self._create_caches([s for s in list(waiting)[:room] if s.cache is None])
        while waiting and len(running) < self.max_running:
            seq = waiting[0]
            if seq.cache is None:
                self._create_caches([seq])
            assert seq.cache is not None
            start = time.perf_counter()
            with self._kvcore():
                resumed = seq.cache.resume()
            if resumed and self.on_resume is not None:
                self.on_resume(time.perf_counter() - start, any(seq.cache.cached_tokens_by_level[1:]))
            if not resumed:
                if not running:
                    raise RuntimeError(f"request {seq.index}: the device level cannot hold it (resume failed)")
                self._release_waiting(waiting)
                return
            if seq.reused_tokens is None:  # its first admission that ran
                seq.reused_tokens, seq.reused_by_level = seq.admitted
                self.stats.reused_tokens += seq.reused_tokens
            running.append(waiting.popleft())

    def _release_waiting(self, waiting: deque[Sequence]) -> None:
        """With the device level alone, a waiting request's cache holds its matched pages, which
        nothing evicts: running requests could not grow. Close those caches; the requests are
        matched again when scheduled. (With a lower level, held pages can fall to it.)"""
        if self._suspend_to_lower_level:
            return
        with self._kvcore():
            for seq in waiting:
                if seq.cache is not None:
                    seq.cache.close()
                    seq.cache = None

    def _create_caches(self, seqs: list[Sequence]) -> None:
        """Caches for ``seqs`` (one ``admit_many`` where it fits), each matched against what
        kvcore holds, reusing all but the prompt's last token at most: that token's forward gives
        the logits of the first output token. Then their index tensors."""
        if not seqs:
            return
        caps = [len(s.tokens) - 1 if self.reuse else 0 for s in seqs]
        with self._kvcore():
            if len(seqs) > 1 and self.backend.capabilities.batched_calls:
                scopes, prompts = [s.scope for s in seqs], [s.tokens for s in seqs]
                caches = self.manager.admit_many(scopes, prompts, max_reused_tokens=caps)
            else:
                caches = [
                    self.manager.create_kv_cache(s.scope, s.tokens, max_reused_tokens=c)
                    for s, c in zip(seqs, caps, strict=True)
                ]
            for seq, cache in zip(seqs, caches, strict=True):
                self._attach(seq, cache)

    def _attach(self, seq: Sequence, cache: kv_api.KVCache) -> None:
        blocks = -(-(seq.prompt_length + seq.max_new_tokens) // self.layout.tokens_per_block)
        seq.cache = cache
        seq.computed = seq.committed = cache.num_committed_tokens
        seq.slots = {g: torch.empty(blocks, dtype=torch.int32) for g in self.views.attention_groups}
        for g, buf in seq.slots.items():
            cache.set_base_page_index_buf(0, g, buf)
        seq.admitted = (seq.computed, tuple(cache.cached_tokens_by_level))

    def _step(self, waiting: deque[Sequence], running: list[Sequence]) -> None:
        self.stats.steps += 1
        due: list[Sequence] = []
        for seq in list(running):
            if seq not in running:  # preempted earlier in this step
                continue
            n = self._chunk(seq)
            if not self._reserve(seq, seq.computed + n, waiting, running):
                continue
            logits = self._forward(seq, n)
            seq.computed += n
            if seq.computed == len(seq.tokens):
                seq.tokens.append(int(logits.argmax()))
                seq.latency_s = time.perf_counter() - self._start
                if len(seq.generated) == 1:
                    seq.ttft_s = seq.latency_s
                if self.keep_logits:
                    seq.logits.append(logits.clone())
            if seq.finished or n > 1 or seq.computed % self.layout.tokens_per_block == 0:
                due.append(seq)
        self._commit([s for s in due if s in running])
        for seq in [s for s in running if s.finished]:
            running.remove(seq)
            self._finish(seq)

    def _chunk(self, seq: Sequence) -> int:
        """Tokens of the next forward: up to the next multiple of ``prefill_chunk``."""
        boundary = (seq.computed // self.prefill_chunk + 1) * self.prefill_chunk
        return min(len(seq.tokens), boundary) - seq.computed

    def _reserve(self, seq: Sequence, capacity: int, waiting: deque[Sequence], running: list[Sequence]) -> bool:
        """Room for ``capacity`` tokens, preempting the youngest running requests; False when
        ``seq`` itself was preempted."""
        assert seq.cache is not None
        while not self._resize(seq.cache, capacity):
            victim = running[-1]
            if victim is seq and len(running) == 1:
                raise RuntimeError(f"request {seq.index}: the device level cannot hold {capacity} tokens")
            self._preempt(victim, waiting, running)
            if victim is seq:
                return False
        return True

    def _resize(self, cache: kv_api.KVCache, capacity: int) -> bool:
        with self._kvcore():
            return cache.resize(capacity)

    def _preempt(self, seq: Sequence, waiting: deque[Sequence], running: list[Sequence]) -> None:
        """Suspend (its pages may fall to a lower level, coming back on resume), or, with the
        device level alone (where held pages are never evicted), close it: it is matched
        again, recomputing what was evicted meanwhile, when admitted again."""
        assert seq.cache is not None
        running.remove(seq)
        seq.preemptions += 1
        self.stats.preemptions += 1
        self._commit([seq])
        with self._kvcore():
            if self._suspend_to_lower_level:
                seq.cache.suspend()
            else:
                seq.cache.close()
                seq.cache = None
        waiting.appendleft(seq)

    def _forward(self, seq: Sequence, n: int) -> torch.Tensor:
        """One forward of ``tokens[H:H+n]`` at explicit positions; the last position's logits."""
        assert seq.cache is not None
        h = seq.computed
        with self._kvcore():
            self.views.refresh()
            cache = PagedCache(self.views, seq.cache, seq.slots, h)
        t = time.perf_counter()
        with torch.no_grad():
            out = self.model(
                input_ids=torch.tensor([seq.tokens[h : h + n]]),
                cache=cache,
                use_cache=True,
                position_ids=torch.arange(h, h + n)[None],
                logits_to_keep=1,
            )
        self.stats.forward_s += time.perf_counter() - t
        self.stats.forwards += 1
        self.stats.computed_tokens += n
        self._note_blocks(cache)
        logits: torch.Tensor = out.logits[0, -1]
        return logits

    def _note_blocks(self, cache: PagedCache) -> None:
        for g in self.views.attention_groups:
            locked = int((cache.slots(g) >= 0).sum())
            self.stats.peak_blocks[g] = max(self.stats.peak_blocks.get(g, 0), locked)

    def _commit(self, seqs: list[Sequence]) -> None:
        """Commit the computed, uncommitted tokens of ``seqs`` (one batched call if it fits)."""
        seqs = [s for s in seqs if s.uncommitted]
        caches = [s.cache for s in seqs if s.cache is not None]
        if len(caches) != len(seqs):
            raise RuntimeError("a request to commit has no cache")
        with self._kvcore():
            if len(seqs) > 1 and self.backend.capabilities.batched_calls:
                tokens = [t for s in seqs for t in s.uncommitted]
                self.manager.commit_many(caches, tokens, [len(s.uncommitted) for s in seqs])
            else:
                for seq, cache in zip(seqs, caches, strict=True):
                    cache.commit(seq.uncommitted)
        for seq in seqs:
            seq.committed = seq.computed

    def _finish(self, seq: Sequence) -> None:
        assert seq.cache is not None
        self._commit([seq])
        with self._kvcore():
            seq.cache.close()
        seq.cache = None
