"""The poison latch (docs/errors.md, "The poison latch"): once an internal invariant violation is
recorded, every public call of the backend's managers, caches and event managers raises
``CorruptedError`` naming it; ``poison_reason()`` reports it without clearing it; ``take_poison()``
clears it only when ``num_live_managers()`` is 0. The violation is provoked through the debug-only
hook ``_debug_poison``, which works only with ``KV_DEBUG_HOOKS=1``.

Every test here takes the poison back before it ends; the suite's plugin fails any test that
leaves a backend poisoned (and clears it), so the rest of the worker is unaffected either way.
"""

from __future__ import annotations

import abc
import gc
import inspect
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from functools import partial
from typing import Any

import pytest

import kv_api
from kv_api.errors import CorruptedError, LogicError

from ._manager import active, make_manager, toks

REASON = "test: a deliberately broken invariant"
CONTRACT: list[type[abc.ABC]] = [kv_api.KVCacheManager, kv_api.KVCache, kv_api.KVCacheEventManager]


@pytest.fixture
def hooks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("KV_DEBUG_HOOKS", "1")
    yield


def debug_poison(backend: kv_api.Backend, reason: str = REASON) -> None:
    hook: Callable[[str], None] | None = getattr(backend, "_debug_poison", None)
    if hook is None:
        pytest.skip(f"backend {backend.name!r} has no _debug_poison hook")
    hook(reason)


def no_manager_alive(backend: kv_api.Backend) -> None:
    """Collect what the test dropped (a Python manager may sit in a reference cycle)."""
    gc.collect()
    assert backend.num_live_managers() == 0, "a manager outlives the test's references"


def corrupted(reason: str = REASON) -> AbstractContextManager[pytest.ExceptionInfo[CorruptedError]]:
    return pytest.raises(CorruptedError, match=f"^kvcore is poisoned: {reason}$")


def calls(contract: type[abc.ABC], obj: object) -> Iterator[tuple[str, Callable[[], object]]]:
    """One call per member the contract declares: each property read (and set, where settable),
    each method with None for every parameter without a default. The latch comes before any
    argument check, so None is as good as a valid argument."""
    for name in sorted(contract.__abstractmethods__):
        if name == "__init__":
            continue
        member = inspect.getattr_static(contract, name)
        if isinstance(member, property):
            yield f"{name} (get)", partial(getattr, obj, name)
            if member.fset is not None:
                yield f"{name} (set)", partial(setattr, obj, name, None)
            continue
        parameters = list(inspect.signature(member).parameters.values())[1:]
        required = sum(1 for p in parameters if p.default is inspect.Parameter.empty)
        yield name, partial(getattr(obj, name), *[None] * required)


def raise_on_every_call(contract: type[abc.ABC], objects: list[Any]) -> int:
    """Checks that every call ``calls`` makes on each object raises ``CorruptedError``; how many."""
    n = 0
    for obj in objects:
        for name, call in calls(contract, obj):
            with corrupted():
                call()
                pytest.fail(f"{type(obj).__name__}.{name} did not raise")
            n += 1
    return n


def test_the_hook_refuses_without_the_variable(backend: kv_api.Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    for value in (None, "0", "", "yes"):
        if value is None:
            monkeypatch.delenv("KV_DEBUG_HOOKS", raising=False)
        else:
            monkeypatch.setenv("KV_DEBUG_HOOKS", value)
        with pytest.raises(RuntimeError, match="KV_DEBUG_HOOKS=1"):
            debug_poison(backend)
        assert backend.poison_reason() is None


def test_the_variable_is_read_at_each_call(backend: kv_api.Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KV_DEBUG_HOOKS", "1")
    debug_poison(backend)
    no_manager_alive(backend)  # earlier tests' managers in reference cycles would block the take
    assert backend.take_poison() == REASON
    monkeypatch.delenv("KV_DEBUG_HOOKS")
    with pytest.raises(RuntimeError, match="KV_DEBUG_HOOKS=1"):
        debug_poison(backend)
    assert backend.poison_reason() is None


def test_poison_reason_reports_the_first_reason_and_never_clears(backend: kv_api.Backend, hooks: None) -> None:
    assert backend.poison_reason() is None
    debug_poison(backend)
    debug_poison(backend, "a later consequence")
    assert backend.poison_reason() == REASON
    assert backend.poison_reason() == REASON  # reading does not clear
    no_manager_alive(backend)
    assert backend.take_poison() == REASON
    assert backend.poison_reason() is None
    assert backend.take_poison() is None  # nothing left to take


def test_every_public_call_raises_corrupted_error(backend: kv_api.Backend, hooks: None) -> None:
    events = backend.KVCacheEventManager()
    manager = make_manager(backend, event_manager=events)
    running = active(manager, 8, toks(6))  # ACTIVE, with committed and uncommitted pages
    waiting = manager.create_kv_cache(None, toks(6))  # SUSPENDED, reusing the first block
    closed = manager.create_kv_cache()
    closed.close()
    config = manager.init_config
    debug_poison(backend)
    called = (
        raise_on_every_call(kv_api.KVCacheManager, [manager])
        + raise_on_every_call(kv_api.KVCache, [running, waiting, closed])
        + raise_on_every_call(kv_api.KVCacheEventManager, [events])
    )
    assert called > 100, "the contract's members were not found"
    # Constructors too: no new manager joins a poisoned backend.
    with corrupted():
        backend.KVCacheManager(config)
    with corrupted():
        backend.KVCacheEventManager()
    # Teardown does no bookkeeping on a poisoned backend: dropping open caches raises nothing.
    del running, waiting, closed, manager, events
    no_manager_alive(backend)
    assert backend.take_poison() == REASON


def test_take_poison_waits_until_no_manager_is_alive(backend: kv_api.Backend, hooks: None) -> None:
    no_manager_alive(backend)
    first = make_manager(backend)
    second = make_manager(backend)
    cache = active(second, 4, toks(4))
    assert backend.num_live_managers() == 2
    debug_poison(backend)
    for live in (2, 1):
        with pytest.raises(LogicError, match=rf"^take_poison\(\): {live} manager\(s\) still alive$"):
            backend.take_poison()
        assert backend.poison_reason() == REASON  # refused: the latch stays
        if live == 2:
            del first
        gc.collect()
    del cache, second  # the cache kept its manager alive
    no_manager_alive(backend)
    assert backend.take_poison() == REASON
    assert backend.poison_reason() is None
    # A new manager works again, from a clean slate.
    manager = make_manager(backend)
    assert backend.num_live_managers() == 1
    cache = active(manager, 8, toks(8))
    cache.close()
    assert manager.probe_reuse(None, toks(8)) == 8
    manager.shutdown()
    assert backend.num_live_managers() == 0


def test_shutdown_counts_a_manager_down_once(backend: kv_api.Backend) -> None:
    gc.collect()
    before = backend.num_live_managers()
    manager = make_manager(backend)
    assert backend.num_live_managers() == before + 1
    manager.shutdown()
    assert backend.num_live_managers() == before
    manager.shutdown()  # idempotent, and counted once
    del manager
    gc.collect()
    assert backend.num_live_managers() == before


def test_a_manager_that_fails_to_build_is_not_counted(backend: kv_api.Backend) -> None:
    gc.collect()
    before = backend.num_live_managers()
    with pytest.raises(TypeError):
        backend.KVCacheManager(None)  # type: ignore[arg-type]
    gc.collect()
    assert backend.num_live_managers() == before


def test_shutdown_while_poisoned_raises_and_keeps_the_manager_alive(backend: kv_api.Backend, hooks: None) -> None:
    no_manager_alive(backend)
    manager = make_manager(backend)
    debug_poison(backend)
    with corrupted():
        manager.shutdown()
    assert backend.num_live_managers() == 1
    with pytest.raises(LogicError):
        backend.take_poison()
    del manager
    no_manager_alive(backend)
    assert backend.take_poison() == REASON


def test_backends_agree_and_keep_their_own_latch(backends: list[kv_api.Backend], hooks: None) -> None:
    """Each backend module has its own latch; poisoned, they fail the same calls the same way."""
    if len(backends) < 2:
        pytest.skip("needs two backends")
    messages = set()
    for poisoned in backends:
        others = [b for b in backends if b is not poisoned]
        managers = {b.name: make_manager(b) for b in backends}
        debug_poison(poisoned)
        for b in others:
            assert b.poison_reason() is None
            cache = active(managers[b.name], 4, toks(4))  # unaffected
            cache.close()
        with pytest.raises(CorruptedError) as info:
            managers[poisoned.name].probe_reuse(None, toks(4))
        messages.add(str(info.value))
        del info, cache  # the traceback refers to the manager
        managers.clear()
        no_manager_alive(poisoned)
        assert poisoned.take_poison() == REASON
    assert messages == {f"kvcore is poisoned: {REASON}"}
