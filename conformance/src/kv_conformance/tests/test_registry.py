"""The installed backends through the registry: they load, the default is the highest priority,
``create_manager`` builds on each, and a third backend joins through its entry point alone.
(The registry's own rules are tested by kv-api.)"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path

import pytest

import kv_api
from kv_api.contract import BACKEND_ATTRIBUTES
from kv_api.errors import BackendError

CONFIG = kv_api.KVCacheManagerConfig(
    tokens_per_block=16,
    cache_tiers=[kv_api.GpuCacheTierConfig(quota=1 << 20)],
    layers=[kv_api.AttentionLayerConfig(0, [kv_api.BufferConfig("key", 1024), kv_api.BufferConfig("value", 1024)])],
)


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory on ``sys.path`` to install distributions into; the registry's cache restored after."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr("kv_api.registry._loaded", dict(kv_api.registry._loaded))
    yield tmp_path
    for mod in [m for m in sys.modules if m.startswith("third_kv")]:
        del sys.modules[mod]


THIRD_BACKEND = """
    # A newcomer's backend: it re-exports the backend under test, under its own name, and ranks
    # itself above the shipped backends, so it becomes the default once installed.
    from {module} import {attributes}

    name = "third"
    version = "9.9"
    priority = 1_000_000


    def build_info():
        return {{"origin": "test fixture"}}
"""


def test_installed_backends_load() -> None:
    names = kv_api.available_backends()
    assert names, "no backend loads"
    for name in names:
        b = kv_api.load_backend(name)
        assert b.name == name
        assert isinstance(b, kv_api.Backend)
        assert type(b.priority) is int


def test_the_default_is_the_highest_priority(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KV_BACKEND", raising=False)
    ranked = sorted(kv_api.available_backends(), key=lambda n: (-kv_api.load_backend(n).priority, n))
    assert kv_api.default_backend_name() == ranked[0]
    assert list(kv_api.available_backends()) == ranked
    if {"cpp", "py"} <= set(ranked):  # the native backend wherever it loads
        assert ranked.index("cpp") < ranked.index("py")


def test_third_backend_through_entry_point(
    site: Path, monkeypatch: pytest.MonkeyPatch, backend: kv_api.Backend
) -> None:
    """docs/adding-a-backend.md: a distribution registering a module is all it takes."""
    (module,) = [ep.value for ep in entry_points(group=kv_api.ENTRY_POINT_GROUP) if ep.name == backend.name]
    own = {"name", "version", "priority", "build_info"}
    source = THIRD_BACKEND.format(module=module, attributes=", ".join(sorted(set(BACKEND_ATTRIBUTES) - own)))
    info = site / "third_kv-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: third_kv\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{kv_api.ENTRY_POINT_GROUP}]\nthird = third_kv\n")
    (site / "third_kv.py").write_text(textwrap.dedent(source))
    assert "third" in kv_api.installed_backends()
    assert kv_api.available_backends()[0] == "third"
    third = kv_api.load_backend("third")
    assert third.version == "9.9" and third.build_info() == {"origin": "test fixture"}
    monkeypatch.delenv("KV_BACKEND", raising=False)
    assert kv_api.default_backend_name() == "third"
    manager = kv_api.create_manager(CONFIG)  # on the default backend
    assert isinstance(manager, third.KVCacheManager) and isinstance(manager, kv_api.KVCacheManager)


def test_default_backend_follows_env(monkeypatch: pytest.MonkeyPatch, backend: kv_api.Backend) -> None:
    monkeypatch.setenv("KV_BACKEND", backend.name)
    assert kv_api.default_backend_name() == backend.name
    assert isinstance(kv_api.create_manager(CONFIG), backend.KVCacheManager)
    monkeypatch.setenv("KV_BACKEND", "definitely-not-installed")
    with pytest.raises(BackendError):
        kv_api.create_manager(CONFIG)


def test_create_manager_on_a_chosen_backend(backend: kv_api.Backend) -> None:
    events = backend.KVCacheEventManager(16)
    for chosen in (backend.name, backend):
        manager = kv_api.create_manager(CONFIG, backend=chosen)
        assert isinstance(manager, backend.KVCacheManager)
    manager = kv_api.create_manager(CONFIG, backend=backend, event_manager=events)
    events.flush_iteration_events()
    assert [type(e.data) for e in events.get_latest_events()] == [kv_api.events.Created]


def test_manager_is_a_kv_api_manager(backend: kv_api.Backend) -> None:
    manager = backend.KVCacheManager(CONFIG)
    assert isinstance(manager, kv_api.KVCacheManager)
    assert isinstance(manager.create_kv_cache(), kv_api.KVCache)
    assert isinstance(backend.KVCacheEventManager(), kv_api.KVCacheEventManager)
    assert manager.tokens_per_block == 16
    assert manager.init_config == CONFIG
