"""Committing a cache into the radix tree (docs/manager.md, "Committing"): tokens recorded, full
blocks entering the tree, a block already there taking our place (rebase), commit_min_snapshot's
snapshots, and the stop."""

from __future__ import annotations

from typing import Any

from kv_api.constants import GPU_LEVEL, KVCacheStatus
from kv_api.errors import LogicError, OutOfPagesError
from kv_core_py import planned_drop, poison
from kv_core_py.block_keys import chained_keys
from kv_core_py.cache_room import CacheRoom
from kv_core_py.cache_state import CacheBlock, CommitState
from kv_core_py.page import Page
from kv_core_py.prompt_keys import PromptKeys
from kv_core_py.radix_tree import Block, Node
from kv_core_py.request_stats import first_digest, text_only_error
from kv_core_py.tokens import Tokens


class CacheCommit(CacheRoom):
    """The commit part of ``KVCache``; private methods expect the manager's lock held."""

    def commit(self, tokens: Any, is_end: bool = False) -> None:
        """Record computed tokens (ACTIVE only); each block they fill enters the radix tree.
        ``is_end`` then calls ``stop_committing()``."""
        poison.check()
        with self._context.lock:
            self._require(KVCacheStatus.ACTIVE, "commit")
            if self._commit_state == CommitState.USER_STOP:
                raise LogicError("Cannot commit tokens after stop_committing()")
            new = Tokens(tokens, self._context.key_format).to_list()
            end = bool(is_end)  # converted before anything changes: a failing __bool__ commits nothing
            if self.stats.text_only and (digest := first_digest(new)) is not None:
                raise text_only_error("tokens", digest)
            committed = len(self._tokens)
            if committed + len(new) > self._capacity:
                raise ValueError(
                    f"commit: {committed} committed + {len(new)} new tokens exceed capacity {self._capacity}"
                )
            min_snapshot = self._context.commit_min_snapshot
            if min_snapshot and self._history not in (committed, committed + len(new)):
                raise LogicError(
                    f"commit: with commit_min_snapshot, history_length ({self._history}) must equal the committed"
                    f" tokens before ({committed}) or after ({committed + len(new)}) the commit"
                )
            self._check_scratch_history("commit", self._capacity, max(self._history, committed + len(new)))
            first = committed // self._tokens_per_block
            self._tokens.extend(new)
            self._history = max(self._history, len(self._tokens))
            for layer_group in self._block_layer_groups:  # a longer history leaves fewer scratch blocks
                self._free_scratch(layer_group, self._scratch_need(layer_group, self._capacity, self._history))
            if min_snapshot:  # pages out of the window go before their blocks could enter the tree
                self._apply_stale_releases(self._stale_releases(self._history), self._history)
            for ordinal in range(first, len(self._tokens) // self._tokens_per_block):
                self._commit_block(ordinal)
            if len(self._tokens) // self._tokens_per_block > first:
                self._prompt_keys = PromptKeys()  # what it held is committed (or is not the prompt)
            if min_snapshot and new and not end:
                self._snapshot(move=False)
            self._apply_stale_releases(self._stale_releases(self._history), self._history)
            if end:
                self._stop_committing_locked(move_state=min_snapshot)
            if self._context.remote is not None:
                self._context.remote.flush()

    def _parent_node(self, ordinal: int) -> Node | None:
        if ordinal == 0:
            return self._context.tree.root(self._root_key, self._reuse_scope)
        return self._blocks[ordinal - 1].tree_block

    def _commit_block(self, ordinal: int, pages: list[Page | None] | None = None) -> None:
        """Put block ``ordinal`` (full, or the partial tail on stop) into the tree. A block
        already there keeps the pages covering it and ours are given up for them (rebase); ours
        fill the layer groups it lacks or covers only in part. A partial block a sibling extends
        is not added (ours stay private); a new block replaces the partial sibling it extends
        and adopts its pages. Without a parent in the tree the cache stops committing.
        ``pages`` (a partial tail only) replaces the block's own: its snapshot copies, or its
        live pages and SSM state."""
        if self._commit_state == CommitState.VIRTUAL_STOP:
            return
        parent = self._parent_node(ordinal)
        if parent is None:
            self._commit_state = CommitState.VIRTUAL_STOP
            return
        cache_block = self._blocks[ordinal]
        tokens_per_block = self._tokens_per_block
        tokens = tuple(self._tokens[ordinal * tokens_per_block : (ordinal + 1) * tokens_per_block])
        full = len(tokens) == tokens_per_block
        key = self._prompt_keys.key(parent.key, tokens, ordinal) if full else None
        if key is None:
            key = chained_keys(parent.key, Tokens(tokens, self._context.key_format), 0, 1, tokens_per_block)[1]
        block = parent.children.get(key)
        if block is None:
            tree = self._context.tree
            if not full and tree.covering_sibling(parent, tokens) is not None:
                return
            shorter = tree.covered_sibling(parent, tokens)
            block = tree.add(parent, key, tokens, ordinal)
            self.stats.committed_block()
            if full and self._context.remote is not None:
                self._context.remote.pending.append(block)
            if shorter is not None:
                self._context.storage.adopt(block, shorter)
        ours_by_group = cache_block.pages if pages is None else pages
        for layer_group in range(len(self._life_cycles)):
            self._join(block, ordinal, layer_group, ours_by_group[layer_group], len(tokens))
        if cache_block.tree_block is None and full:
            # Later blocks hang under a full block, so it stays in the tree while we are open (we
            # hold all its pages). A partial tail is the last block: nothing hangs under it, and
            # when it already existed we keep our private page and hold none of its pages.
            cache_block.tree_block = block
            block.pins += 1
        else:
            self._context.tree.prune(block)  # a new partial block none of our pages went into

    def _join(self, block: Block, ordinal: int, layer_group: int, ours: Page | None, num_tokens: int) -> None:
        """Our page ``ours`` of block ``ordinal`` meets the tree block's in one layer group: the
        tree's page, when it covers the block, replaces ours (rebase), or ours takes its place;
        otherwise ours, uncommitted, becomes the tree block's."""
        cache_block = self._blocks[ordinal]
        theirs = block.pages[layer_group]
        full = num_tokens == self._tokens_per_block
        if theirs is None or theirs.num_tokens < num_tokens:
            if ours is not None and not ours.committed:
                self._attach(block, layer_group, ours, num_tokens)
            return
        if ours is None or ours is theirs or not full:
            return
        locked = cache_block.locked[layer_group]
        if locked and theirs.level != GPU_LEVEL:
            if theirs.holders:
                # Another cache holds the tree's page and pins the block on it: the page stays
                # the block's, and we hold it too, so it outlives our pin as well; ours stays
                # private.
                self._context.storage.hold(theirs)
                self._tree_holds.append(theirs)
            else:
                # The tree's copy sits on a colder level and ours, locked, is on the device:
                # ours takes its place (we hold it, so nothing drops the block).
                self._context.storage.replace(block, layer_group, ours)
            return
        self._context.storage.hold(theirs)
        if locked:
            self._unlock_page(ordinal, layer_group)
            cache_block.pages[layer_group] = theirs
            self._lock_page(ordinal, layer_group)
        else:
            cache_block.pages[layer_group] = theirs
        self._context.storage.unhold(ours)

    def _attach(self, block: Block, layer_group: int, page: Page, num_tokens: int) -> None:
        """``page`` (uncommitted) becomes the block's page in ``layer_group``, valid for
        ``num_tokens``; a page it had covers fewer (an adopted one covering a prefix) and is
        orphaned."""
        theirs = block.pages[layer_group]
        if theirs is not None:
            self._context.storage.orphan(theirs)
        page.block = block
        page.num_tokens = num_tokens
        block.pages[layer_group] = page
        self.stats.attached(layer_group)
        if self._context.events is not None:
            self._context.events.stored(block, layer_group, page.priority, page.level)

    def _snapshot_sources(self) -> tuple[Block | None, list[tuple[int, Page]]] | None:
        """What ``_snapshot`` puts into the tree: the full last block it goes into (None: the
        partial tail, committed with them) and its (layer group, page) sources; None for none."""
        n = len(self._tokens)
        if n == 0 or self._commit_state == CommitState.VIRTUAL_STOP:
            return None
        tokens_per_block = self._tokens_per_block
        states = [
            (layer_group, p)
            for layer_group in self._ssm_layer_groups
            if (p := self._ssm_state[layer_group]) is not None and not p.committed
        ]
        if n % tokens_per_block:
            cache_block: CacheBlock = self._blocks[n // tokens_per_block]
            if cache_block.copy_on_resume:
                return None  # a reused partial block not copied yet: nothing of ours to snapshot
            live = [
                (layer_group, p)
                for layer_group in self._block_layer_groups
                if (p := cache_block.pages[layer_group]) is not None and not p.committed
            ]
            return None, live + states
        block = self._blocks[n // tokens_per_block - 1].tree_block
        if block is None:
            return None
        # The full block is in the tree already: only states it lacks.
        return block, [(g, p) for g, p in states if (t := block.pages[g]) is None or t.num_tokens < tokens_per_block]

    def _snapshot(self, move: bool) -> None:
        """commit_min_snapshot: what a request reusing exactly the committed tokens needs enters
        the tree: a partial tail's attention pages and the SSM states, each valid for the tokens
        of its block that are committed. ``move`` gives the live pages (the request ends),
        otherwise copies, made only if room can be (no snapshot else: it is a cache, not state)."""
        found = self._snapshot_sources()
        if found is None or not found[1]:
            return
        block, sources = found
        pages = [p for _, p in sources] if move else self._copies([p for _, p in sources])
        if pages is None:
            self.stats.snapshot_skipped([layer_group for layer_group, _ in sources])
            return
        if block is None:
            override: list[Page | None] = [None] * len(self._life_cycles)
            for (layer_group, _), page in zip(sources, pages, strict=True):
                override[layer_group] = page
            self._commit_block(len(self._tokens) // self._tokens_per_block, override)
        else:
            for (layer_group, _), page in zip(sources, pages, strict=True):
                self._attach(block, layer_group, page, self._tokens_per_block)
        if not move:
            for page in pages:  # the tree keeps the copies that went in; the others are freed
                self._context.storage.unhold(page)

    def _copies(self, sources: list[Page]) -> list[Page] | None:
        """New device pages holding ``sources``' data (held once each), or None without room."""
        storage = self._context.storage
        try:
            pages = storage.new_pages([(p.layer_group, p.priority) for p in sources])
        except OutOfPagesError:
            return None
        for page in pages:
            page.holders = 1
        try:
            for src, dst in zip(sources, pages, strict=True):
                storage.copy(src, dst)
        except Exception:
            for page in pages:
                storage.unhold(page)
            raise
        return pages

    def stop_committing(self) -> None:
        """Commit the partial tail block, then accept no more commits. Idempotent."""
        poison.check()
        with self._context.lock:
            self._stop_committing_locked()

    def _stop_committing_locked(self, move_state: bool = False) -> None:
        """``move_state`` (commit_min_snapshot, ``is_end``): the live tail pages and SSM states
        go into the tree, not copies of them."""
        if self._commit_state == CommitState.USER_STOP or self._status == KVCacheStatus.CLOSED:
            return
        tail = len(self._tokens) % self._tokens_per_block
        ordinal = len(self._tokens) // self._tokens_per_block
        if move_state:
            self._snapshot(move=True)
        elif tail and ordinal < len(self._blocks) and not self._blocks[ordinal].copy_on_resume:
            self._commit_block(ordinal)
        self._commit_state = CommitState.USER_STOP
        self._apply_stale_releases(self._stale_releases(self._history), self._history)

    def plan_committed_block_drop(self) -> planned_drop.PlannedDropHandle | None:
        """A plan to drop the committed tokens' trailing window pages and last SSM snapshot
        (``planned_drop.plan``); ``LogicError`` before ``stop_committing()``."""
        poison.check()
        with self._context.lock:
            if self._commit_state != CommitState.USER_STOP:
                raise LogicError("plan_committed_block_drop() requires stop_committing()")
            return planned_drop.plan(self._context, self._root_key, self._tokens)
