"""Planned drops (docs/manager.md, "Planned drops"): a finished request's tree pages that only its
exact continuation would reuse (the trailing window pages, the last block's SSM snapshot), to be
dropped once the caller knows no continuation comes. Each page counts the plans outstanding on
it, so several plans on one page must all be dropped before it goes.
"""

from __future__ import annotations

from types import TracebackType

import kv_api
from kv_api.errors import LogicError
from kv_api.keys import Token
from kv_core_py import poison
from kv_core_py.cache_context import CacheContext
from kv_core_py.page import Page
from kv_core_py.tokens import Tokens


class PlannedDropHandle(kv_api.PlannedDropHandle):
    """Made under the manager's lock by ``plan``; see ``kv_api.PlannedDropHandle``. It keeps
    its manager's state alive (the context), not the manager itself."""

    def __init__(self, context: CacheContext, pages: list[Page]) -> None:
        self._context = context
        self._pages: list[Page] | None = pages  # None once dropped
        for page in pages:
            page.planned_drops += 1

    def drop(self) -> None:
        poison.check()
        with self._context.lock:
            if self._pages is None:
                raise LogicError("Planned drop handle has already been dropped")
            self._apply()

    def _apply(self) -> None:
        """Withdraw the plan. A page dropped or freed meanwhile is skipped (a page of a shut-down
        manager is); one still held, or still planned by another handle, stays in the tree and is
        evicted as any other page later."""
        pages, self._pages = self._pages, None
        assert pages is not None
        storage = self._context.storage
        for page in pages:
            if not page.alive:
                continue
            page.planned_drops -= 1
            if page.planned_drops == 0 and page.committed and page.holders == 0 and page.queued:
                storage.drop_now(page)

    def __enter__(self) -> PlannedDropHandle:
        poison.check()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc_value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        poison.check()
        with self._context.lock:
            if self._pages is not None:
                self._apply()

    def __del__(self) -> None:
        try:
            # Poisoned, the pages' bookkeeping cannot be trusted: the plan is forgotten.
            if self._pages is not None and poison.reason() is None:
                with self._context.lock:
                    self._apply()
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass


def plan(context: CacheContext, root_key: bytes, tokens: list[Token]) -> PlannedDropHandle | None:
    """The plan for a cache's committed ``tokens`` (under the lock, the cache stopped committing):
    None when there are none or the re-match (without backoff) does not reuse them all. Otherwise
    it covers, in the matched tree blocks, each window layer group's pages from the end of its
    stale range at the committed length to the last block (never a sink block: the stale range
    starts after them), and the last block's SSM snapshot. Full attention is never covered."""
    n = len(tokens)
    if n == 0:
        return None
    path = context.rematch(root_key, Tokens(tokens, context.key_format))
    if sum(matched for _, matched in path) != n:
        return None
    end = len(path)
    pages: list[Page] = []
    for kind in context.registry.kinds:
        first = kind.planned_drop_first(n, end)
        if first is None:
            continue
        for block, _ in path[first:]:
            page = block.pages[kind.life_cycle.id]
            if page is None:  # the match validated these: defensive
                return None
            pages.append(page)
    return PlannedDropHandle(context, pages)
