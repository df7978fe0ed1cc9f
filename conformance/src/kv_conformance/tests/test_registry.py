"""The registry: entry-point discovery, default selection, clear errors, a third backend."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import kv_api
from kv_api.errors import BackendError

CONFIG = kv_api.KVCacheManagerConfig(
    tokens_per_block=16,
    cache_tiers=[kv_api.GpuCacheTierConfig(quota=1 << 20)],
    layers=[kv_api.AttentionLayerConfig(0, [kv_api.BufferConfig("key", 1024), kv_api.BufferConfig("value", 1024)])],
)


def _register(tmp_path: Path, dist: str, name: str, target: str, module_source: str | None) -> None:
    """Install a distribution into ``tmp_path`` the way pip would: a module and its dist-info."""
    info = tmp_path / f"{dist}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[kv_api.backends]\n{name} = {target}\n")
    if module_source is not None:
        (tmp_path / f"{target.split(':')[0]}.py").write_text(textwrap.dedent(module_source))


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr("kv_api.registry._loaded", dict(kv_api.registry._loaded))
    yield tmp_path
    for mod in [m for m in sys.modules if m.startswith("third_kv")]:
        del sys.modules[mod]


THIRD_BACKEND = """
    # A newcomer's backend: it reuses the Python backend's keys and wraps its manager.
    import kv_core_py
    from kv_core_py import *  # noqa: F403
    name = "third"
    version = "9.9"

    class KVCacheManager(kv_core_py.KVCacheManager):
        pass

    def build_info():
        return {"origin": "test fixture"}
"""


def test_installed_backends_load() -> None:
    names = kv_api.available_backends()
    assert names, "no backend loads"
    for name in names:
        b = kv_api.load_backend(name)
        assert b.name == name
        assert isinstance(b, kv_api.Backend)


def test_unknown_backend_lists_installed() -> None:
    with pytest.raises(BackendError) as info:
        kv_api.load_backend("no-such-backend")
    message = str(info.value)
    assert "unknown backend 'no-such-backend'" in message
    for name in kv_api.installed_backends():
        assert name in message


def test_third_backend_through_entry_point(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _register(site, "third_kv", "third", "third_kv", THIRD_BACKEND)
    assert "third" in kv_api.installed_backends()
    assert "third" in kv_api.available_backends()
    third = kv_api.load_backend("third")
    assert third.version == "9.9" and third.build_info() == {"origin": "test fixture"}
    monkeypatch.setenv("KV_BACKEND", "third")
    manager = kv_api.KVCacheManager(CONFIG)  # type: ignore[abstract]  # the ABC builds the default backend's
    assert type(manager).__module__ == "third_kv"
    assert isinstance(manager, kv_api.KVCacheManager)


def test_broken_backend_is_reported(site: Path) -> None:
    _register(site, "third_kv_broken", "broken", "third_kv_missing_module", None)
    assert "broken" in kv_api.installed_backends()
    assert "broken" not in kv_api.available_backends()
    with pytest.raises(BackendError) as info:
        kv_api.load_backend("broken")
    assert "failed to load" in str(info.value) and "ModuleNotFoundError" in str(info.value)
    # Other backends still load, and an unknown name mentions the broken one and why.
    with pytest.raises(BackendError) as unknown:
        kv_api.load_backend("nope")
    assert "broken: failed to load" in str(unknown.value)


def test_incomplete_backend_names_missing_attributes(site: Path) -> None:
    _register(site, "third_kv_partial", "partial", "third_kv_partial", 'name = "partial"\nversion = "0"\n')
    with pytest.raises(BackendError) as info:
        kv_api.load_backend("partial")
    assert "missing: capabilities, build_info, KVCacheManager, KVCacheEventManager" in str(info.value)


def test_default_backend_follows_env(monkeypatch: pytest.MonkeyPatch, backend: kv_api.Backend) -> None:
    monkeypatch.setenv("KV_BACKEND", backend.name)
    assert kv_api.default_backend_name() == backend.name
    manager = kv_api.KVCacheManager(CONFIG)  # type: ignore[abstract]  # the ABC builds the default backend's
    assert isinstance(manager, backend.KVCacheManager)
    monkeypatch.setenv("KV_BACKEND", "definitely-not-installed")
    with pytest.raises(BackendError):
        kv_api.KVCacheManager(CONFIG)  # type: ignore[abstract]  # the ABC builds the default backend's


def test_default_prefers_cpp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KV_BACKEND", raising=False)
    expected = "cpp" if "cpp" in kv_api.installed_backends() else "py"
    assert kv_api.default_backend_name() == expected


def test_manager_is_a_kv_api_manager(backend: kv_api.Backend) -> None:
    manager = backend.KVCacheManager(CONFIG)
    assert isinstance(manager, kv_api.KVCacheManager)
    assert manager.tokens_per_block == 16
    assert manager.init_config == CONFIG
