"""Planned drops (docs/manager.md, "Planned drops"): a page of the plan evicted meanwhile is
skipped and the plan's later pages still go; a second ``drop()`` raises the documented message.
"""

from __future__ import annotations

import kv_api
from kv_api.errors import LogicError

from ._manager import GRAIN, attention, make_config, raises_exactly, toks
from .test_planned_drops import removed, used

FULL, WINDOW = 0, 1  # layer groups, each its own pool group here


def test_an_evicted_page_is_skipped_and_the_rest_still_go(backend: kv_api.Backend) -> None:
    """tpb 4, window 8, full attention and the window in pool groups of their own (64 and 16
    slots). 20 committed tokens plan the window pages of blocks 3 and 4; block 3's (priority 0)
    is evicted first when a request needs one window slot more than are free. The drop skips
    it and still drops block 4's."""
    events = backend.KVCacheEventManager(1000, "v2_sha256")
    layers = [attention(0, GRAIN // 64), attention(1, GRAIN // 16, 8)]
    config = make_config(4, layers=layers, quota=2 * GRAIN, initial_pool_ratio=[0.5, 0.5])
    m = backend.KVCacheManager(config, events)
    assert [pg.num_slots for pg in m.pool_group_descs] == [64, 16]
    c = m.create_kv_cache(None, toks(20), None, lambda o, lc: 0 if (o, lc.id) == (3, WINDOW) else 100)
    assert c.resume() and c.resize(20)
    c.commit(toks(20), is_end=True)
    c.close()
    handle = c.plan_committed_block_drop()
    assert handle is not None
    assert used(m) == [(59, 5), (11, 5)] and removed(events) == []
    pressure = m.create_kv_cache(None, [])
    assert pressure.resume() and pressure.resize(4 * 12)  # 12 window slots: one page evicted
    assert removed(events) == [(WINDOW, 1)]
    assert m.probe_reuse(None, toks(20)) == 12
    pressure.close()
    assert used(m) == [(59, 5), (12, 4)]
    handle.drop()
    assert removed(events) == [(WINDOW, 1)]  # block 4's window page
    assert used(m) == [(59, 5), (13, 3)]


def test_a_second_drop_names_the_handle(backend: kv_api.Backend) -> None:
    m = backend.KVCacheManager(make_config(4, layers=[attention(0, GRAIN // 32), attention(1, GRAIN // 32, 8)]))
    c = m.create_kv_cache(None, [])
    assert c.resume() and c.resize(20)
    c.commit(toks(20), is_end=True)
    handle = c.plan_committed_block_drop()
    assert handle is not None
    handle.drop()
    error = raises_exactly(LogicError, handle.drop)
    assert str(error) == "Planned drop handle has already been dropped"
    c.close()
