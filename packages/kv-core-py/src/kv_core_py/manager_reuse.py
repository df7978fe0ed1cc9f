"""The manager's reuse (docs/manager.md, "Reuse"): the radix tree's match of a prompt, its back-off
and cuts, the probes that report it, and the caches created on it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import kv_api
from kv_api._check import int_in_range
from kv_api.config import KVCacheManagerConfig
from kv_api.constants import CACHE_ID_LIMIT, TOKEN_LIMIT
from kv_api.contract import PriorityCallback
from kv_api.keys import check_reuse_scope
from kv_api.scope import ReuseScope
from kv_api.stats import ReuseMatch
from kv_core_py import poison
from kv_core_py.block_keys import chained_keys, root_key
from kv_core_py.cache_context import CacheContext
from kv_core_py.kv_cache import KVCache
from kv_core_py.life_cycles import LifeCycleRegistry
from kv_core_py.radix_tree import Block, RadixTree
from kv_core_py.request_stats import RequestStats, StatsBook, first_digest, text_only_error
from kv_core_py.reuse_report import Misses, find_misses
from kv_core_py.tokens import Tokens


class ManagerReuse(kv_api.KVCacheManager):
    """The reuse part of ``KVCacheManager``; every method expects the manager's lock held,
    except the public ones, which take it."""

    _config: KVCacheManagerConfig
    _context: CacheContext
    _registry: LifeCycleRegistry
    _tree: RadixTree
    _stats: StatsBook
    _next_id: int  # the lowest id a cache created without one may take

    if TYPE_CHECKING:

        def _require_live(self) -> None: ...

    def _scope_and_tokens(self, reuse_scope: Any, tokens: Any) -> tuple[ReuseScope, bytes, Tokens]:
        scope = check_reuse_scope(reuse_scope)
        return scope, root_key(scope), Tokens([] if tokens is None else tokens, self._config.key_format)

    def _match(
        self, root_key: bytes, tokens: Tokens, with_backoff: bool = True, max_reused: int | None = None
    ) -> list[tuple[Block, int]]:
        """The reusable prefix: walk, back off and cap (unless not ``with_backoff``), then cut
        until the endpoint has an SSM snapshot taken exactly there and every attention layer group
        has, for each block it needs at the endpoint, a page covering the matched tokens."""
        config = self._config
        path = self._tree.walk(root_key, tokens, config.tokens_per_block, config.enable_partial_reuse)
        return self._prune(self._back_off(path, max_reused) if with_backoff else path)

    def _match_fetching(
        self, root_key: bytes, scope: ReuseScope, tokens: Tokens, max_reused: int | None
    ) -> tuple[list[tuple[Block, int]], set[int], Misses | None]:
        """``create_kv_cache``'s match: ``_match``'s, its walk continued in the remote tier before
        backing off; the ids of the blocks the remote tier brought; why the rest missed (None
        with ``reuse_report`` off)."""
        config = self._config
        # What is staged goes first, so the match may find it in the store; here, before the walk:
        # the store's code may run finalisers that close caches, which must not change a walk under way.
        if self._context.remote is not None:
            self._context.remote.hand()
        path = self._tree.walk(root_key, tokens, config.tokens_per_block, config.enable_partial_reuse)
        fetched = self._fetch_remote(root_key, scope, tokens, path, max_reused) if self._context.remote else set()
        if not config.reuse_report:
            return self._prune(self._back_off(path, max_reused)), fetched, None
        walked = sum(n for _, n in path)
        full = walked // config.tokens_per_block
        misses = find_misses(
            self._tree, root_key, tokens, walked, path[full - 1][0] if full else None, config.enable_partial_reuse
        )
        backed = sum(n for _, n in self._back_off(path, max_reused))
        path = self._prune(path)
        misses.capped = walked - backed
        misses.stale = backed - sum(n for _, n in path)
        return path, fetched, misses

    def _fetch_remote(
        self, root_key: bytes, scope: ReuseScope, tokens: Tokens, path: list[tuple[Block, int]], max_reused: int | None
    ) -> set[int]:
        """Extend ``path`` past its full blocks with the remote tier's (a partial last block of
        the local walk gives way to a full one from the store), up to ``max_reused`` tokens."""
        remote = self._context.remote
        assert remote is not None
        tokens_per_block = self._config.tokens_per_block
        full = 0
        while full < len(path) and path[full][1] == tokens_per_block:
            full += 1
        limit = len(tokens) if max_reused is None else min(len(tokens), max_reused)
        count = limit // tokens_per_block - full
        if count <= 0:
            return set()
        # The root is looked up (or made) once room is made, which may prune it; the parent block
        # is pinned meanwhile, so that a page-less one is not pruned from under us.
        parent: Block | None = path[full - 1][0] if full else None
        parent_key = path[full - 1][0].key if full else root_key
        keys = chained_keys(parent_key, tokens, full, count, tokens_per_block)[1:]
        chunks = [
            tokens.to_list(b * tokens_per_block, (b + 1) * tokens_per_block) for b in range(full, full + len(keys))
        ]
        keep = {id(p) for block, _ in path for p in block.pages if p is not None}
        if parent is not None:
            parent.pins += 1
        try:
            blocks = remote.fetch(
                parent, parent_key, keys, full, chunks, keep, lambda: self._tree.root(root_key, scope)
            )
        finally:
            if parent is not None:
                parent.pins -= 1
        if blocks:
            path[full:] = [(block, tokens_per_block) for block in blocks]
        return set(map(id, blocks))

    def _back_off(self, path: list[tuple[Block, int]], max_reused: int | None) -> list[tuple[Block, int]]:
        """``reuse_match_backoff`` tokens off the walked path's tail, then down to ``max_reused``
        tokens (whichever leaves fewer)."""
        backoff = self._config.reuse_match_backoff
        if max_reused is not None:
            backoff = max(backoff, sum(n for _, n in path) - max_reused)
        while backoff > 0 and path:
            block, n = path[-1]
            if n > backoff:
                path[-1] = (block, n - backoff)
                backoff = 0
            else:
                path.pop()
                backoff -= n
        return path

    def _prune(self, path: list[tuple[Block, int]], ssm: bool = True) -> list[tuple[Block, int]]:
        """Cut ``path`` until it ends on an SSM snapshot taken there (unless ``ssm`` is False:
        the attention-only length) and every attention layer group has, for each block it needs
        at the endpoint, a page covering the matched tokens."""
        changed = True
        while changed and path:
            changed = ssm and self._prune_ssm(path)
            if changed:
                continue
            total = sum(n for _, n in path)
            for layer_group in self._registry.block_layer_groups:
                begin, end = self._registry.stale_range(layer_group, total)
                for ordinal, (block, n) in enumerate(path):
                    if begin <= ordinal < end:
                        continue
                    page = block.pages[layer_group]
                    coverage = page.num_tokens if page is not None else 0
                    if coverage < n:
                        path[ordinal:] = [(block, coverage)] if coverage else []
                        changed = True
                        break
                if changed:
                    break
        return path

    def _prune_ssm(self, path: list[tuple[Block, int]]) -> bool:
        """Cut ``path`` to the last block with an SSM snapshot inside its matched tokens, at the
        snapshot's length (a state is valid at one position only); empty without one. Whether
        it changed."""
        for layer_group in self._registry.ssm_layer_groups:
            keep = 0
            for ordinal, (block, n) in enumerate(path):
                page = block.pages[layer_group]
                if page is not None and 0 < page.num_tokens <= n:
                    keep = ordinal + 1
            if keep == 0:
                path.clear()
                return True
            block, n = path[keep - 1]
            coverage = block.pages[layer_group].num_tokens  # type: ignore[union-attr]
            if keep < len(path) or coverage != n:
                path[keep - 1 :] = [(block, coverage)]
                return True
        return False

    def probe_reuse(
        self, reuse_scope: ReuseScope | None = None, tokens: Any = None, max_reused_tokens: int | None = None
    ) -> int:
        """Tokens ``create_kv_cache`` would reuse now; changes nothing."""
        poison.check()
        with self._context.lock:
            self._require_live()
            _, root_key, toks = self._scope_and_tokens(reuse_scope, tokens)
            max_reused = _max_reused(max_reused_tokens)
            return sum(n for _, n in self._match(root_key, toks, max_reused=max_reused))

    def probe_reuse_match(
        self, reuse_scope: ReuseScope | None = None, tokens: Any = None, max_reused_tokens: int | None = None
    ) -> ReuseMatch:
        """``probe_reuse``'s match, with how deep the walk went and what attention alone keeps."""
        poison.check()
        with self._context.lock:
            self._require_live()
            _, root_key, toks = self._scope_and_tokens(reuse_scope, tokens)
            max_reused = _max_reused(max_reused_tokens)
            config = self._config
            walked = self._tree.walk(root_key, toks, config.tokens_per_block, config.enable_partial_reuse)
            divergence = sum(n for _, n in walked)
            backed = self._back_off(walked, max_reused)
            attention = sum(n for _, n in self._prune(list(backed), ssm=False))
            reused = sum(n for _, n in self._prune(backed))
            return ReuseMatch(len(toks), divergence, attention, reused)

    def probe_first_new_block_key(
        self, reuse_scope: ReuseScope | None, tokens: Any, max_reused_tokens: int | None = None
    ) -> bytes | None:
        """The key of the first block not reusable now, chained over ``tokens``; None when that
        block would be partial or everything is reusable."""
        poison.check()
        with self._context.lock:
            self._require_live()
            _, root_key, toks = self._scope_and_tokens(reuse_scope, tokens)
            max_reused = _max_reused(max_reused_tokens)
            tokens_per_block = self._config.tokens_per_block
            reusable = sum(n for _, n in self._match(root_key, toks, max_reused=max_reused))
            k = reusable // tokens_per_block
            if reusable >= len(toks) or (k + 1) * tokens_per_block > len(toks):
                return None
            return chained_keys(root_key, toks, 0, k + 1, tokens_per_block)[-1]

    def create_kv_cache(
        self,
        reuse_scope: ReuseScope | None = None,
        input_tokens: Any = None,
        id: int | None = None,
        custom_priority_callback: PriorityCallback | None = None,
        expected_prompt_length: int | None = None,
        text_only: bool | None = None,
        enable_request_stats: bool = False,
        max_reused_tokens: int | None = None,
    ) -> KVCache:
        """A SUSPENDED cache holding the reusable prefix of ``input_tokens``; arguments checked
        left to right."""
        poison.check()
        with self._context.lock:
            self._require_live()
            if custom_priority_callback is not None and not callable(custom_priority_callback):
                raise TypeError("custom_priority_callback: expected a callable or None")
            scope, root_key, toks = self._scope_and_tokens(reuse_scope, input_tokens)
            cache_id = self._next_id if id is None else int_in_range("id", id, 0, CACHE_ID_LIMIT)
            expected = (
                len(toks)
                if expected_prompt_length is None
                else int_in_range("expected_prompt_length", expected_prompt_length, 0, TOKEN_LIMIT)
            )
            if text_only is not None and not isinstance(text_only, bool):
                raise TypeError(f"text_only: expected a bool or None, got {type(text_only).__name__}")
            if not isinstance(enable_request_stats, bool):
                raise TypeError(f"enable_request_stats: expected a bool, got {type(enable_request_stats).__name__}")
            max_reused = _max_reused(max_reused_tokens)
            text = self._config.text_only if text_only is None else text_only
            if text and toks.packed is None and (digest := first_digest(toks.to_list())) is not None:
                raise text_only_error("input_tokens", digest)
            stats = RequestStats(self._stats, cache_id, enable_request_stats, expected, text)
            path, fetched, misses = self._match_fetching(root_key, scope, toks, max_reused)
            reused = sum(n for _, n in path)
            cache = KVCache(
                self,
                self._context,
                cache_id,
                scope,
                root_key,
                toks.to_list(0, reused),
                path,
                custom_priority_callback,
                stats,
                fetched,
                misses,
            )
            self._next_id = max(self._next_id, cache_id) + 1
            self._context.register_cache(cache)
            stats.created(len(toks), reused, bool(path) and bool(self._registry.ssm_layer_groups), misses)
            if self._tree.ghost is not None:
                self._tree.ghost.tick()
            return cache


def _max_reused(value: Any) -> int | None:
    """A ``max_reused_tokens`` argument: None, or an int in ``[0, TOKEN_LIMIT]``."""
    return None if value is None else int_in_range("max_reused_tokens", value, 0, TOKEN_LIMIT)
