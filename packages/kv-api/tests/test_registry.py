"""The registry on throwaway backends: discovery, the default by priority, ``KV_BACKEND``, clear
errors, ``create_manager``. (Installed backends are tested by the conformance suite.)"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import kv_api
from kv_api import registry
from kv_api.errors import BackendError

Install = Callable[..., None]

TOP = 10**9  # above any real backend's priority

CONFIG = kv_api.KVCacheManagerConfig(
    tokens_per_block=16,
    cache_tiers=[kv_api.GpuCacheTierConfig(quota=1 << 20)],
    layers=[kv_api.AttentionLayerConfig(0, [kv_api.BufferConfig("key", 1024), kv_api.BufferConfig("value", 1024)])],
)


@pytest.fixture(autouse=True)
def no_kv_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KV_BACKEND", raising=False)


def test_the_highest_priority_is_the_default(install_backend: Install) -> None:
    install_backend("low", priority=TOP - 1)
    install_backend("high", priority=TOP)
    assert kv_api.available_backends()[:2] == ("high", "low")
    assert kv_api.default_backend_name() == "high"
    assert kv_api.load_backend().name == "high"


def test_equal_priorities_go_by_name(install_backend: Install) -> None:
    install_backend("zeta", priority=TOP)
    install_backend("alpha", priority=TOP)
    assert kv_api.default_backend_name() == "alpha"
    assert kv_api.available_backends()[:2] == ("alpha", "zeta")


def test_kv_backend_overrides_priority(install_backend: Install, monkeypatch: pytest.MonkeyPatch) -> None:
    install_backend("high", priority=TOP)
    install_backend("low", priority=-TOP)
    monkeypatch.setenv("KV_BACKEND", " low , high")  # a comma list, as the suite takes, picks its first
    assert kv_api.default_backend_name() == "low"
    monkeypatch.setenv("KV_BACKEND", "all")  # every backend: the default is the usual one
    assert kv_api.default_backend_name() == "high"


def test_a_backend_that_fails_to_load_is_never_the_default(install_backend: Install) -> None:
    install_backend("broken", source="raise RuntimeError('no GPU here')\n")
    assert "broken" in kv_api.installed_backends()
    assert "broken" not in kv_api.available_backends()
    assert kv_api.default_backend_name() != "broken"


def test_no_loadable_backend_says_why(install_backend: Install, monkeypatch: pytest.MonkeyPatch) -> None:
    install_backend("broken", source="raise RuntimeError('no GPU here')\n")
    everything = registry._entry_points
    monkeypatch.setattr(registry, "_entry_points", lambda: {"broken": everything()["broken"]})
    with pytest.raises(BackendError) as info:
        kv_api.default_backend_name()
    assert str(info.value) == (
        "no installed backend loads\ninstalled backends: broken\n  broken: failed to load: RuntimeError: no GPU here"
    )


def test_unknown_backend_lists_installed(install_backend: Install) -> None:
    install_backend("fake", priority=0)
    with pytest.raises(BackendError) as info:
        kv_api.load_backend("no-such-backend")
    first, installed = str(info.value).splitlines()[:2]
    assert first == "unknown backend 'no-such-backend'"
    assert installed == f"installed backends: {', '.join(kv_api.installed_backends())}"
    assert "fake" in kv_api.installed_backends()


def test_broken_backend_is_reported(install_backend: Install) -> None:
    install_backend("broken", source="")  # an entry point naming a module that does not exist
    with pytest.raises(BackendError) as info:
        kv_api.load_backend("broken")
    assert str(info.value).startswith("backend 'broken' failed to load: ModuleNotFoundError")
    # An unknown name mentions the broken backend and why.
    with pytest.raises(BackendError) as unknown:
        kv_api.load_backend("nope")
    assert "  broken: failed to load: ModuleNotFoundError" in str(unknown.value)


def test_incomplete_backend_names_missing_attributes(install_backend: Install) -> None:
    install_backend("partial", source='name = "partial"\nversion = "0"\n')
    with pytest.raises(BackendError) as info:
        kv_api.load_backend("partial")
    assert "missing: priority, capabilities, KVCacheManager, KVCacheEventManager, build_info" in str(info.value)


@pytest.mark.parametrize("priority", ["'10'", "True", "1.5", "None"])
def test_priority_must_be_an_int(install_backend: Install, priority: str) -> None:
    install_backend("odd", priority=priority)
    with pytest.raises(BackendError, match="priority: expected an int"):
        kv_api.load_backend("odd")


def test_a_backend_must_call_itself_by_its_entry_point_name(install_backend: Install) -> None:
    install_backend("alias", calls_itself="other")
    with pytest.raises(BackendError, match="registered as 'alias' but names itself 'other'"):
        kv_api.load_backend("alias")


def test_create_manager_on_the_default_a_name_or_a_loaded_backend(install_backend: Install) -> None:
    install_backend("fake", priority=TOP)
    events: Any = object()  # the fake manager takes anything
    copier: Any = object()
    for backend in (None, "fake", kv_api.load_backend("fake")):
        manager: Any = kv_api.create_manager(CONFIG, backend=backend, event_manager=events)
        assert type(manager).__module__ == "kv_fake_fake"
        assert manager.built_with == (CONFIG, events, None)
        manager = kv_api.create_manager(CONFIG, backend=backend, page_copier=copier)
        assert manager.built_with == (CONFIG, None, copier)


def test_the_contract_cannot_be_instantiated() -> None:
    """No factory hides behind the ABC: ``create_manager`` is the one way to the default backend."""
    contract: Any = kv_api.KVCacheManager
    with pytest.raises(TypeError, match="abstract"):
        contract(CONFIG)
