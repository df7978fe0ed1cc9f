"""Throwaway backends installed the way pip would, for the registry's tests."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kv_api import registry

#: A module that passes the registry's checks; ``{name}`` and ``{priority}`` (source) are filled in.
FAKE_BACKEND = """
    from kv_api import Capabilities
    from kv_api.keys import (
        block_hash_v1,
        block_hash_v2_sha256,
        block_hash_v2_sha256_64,
        block_keys,
        block_keys_many,
        cache_salt_to_id,
        gen_multimodal_cache_key_tokens,
        reuse_scope_to_bytes,
        sequence_to_blockchain_keys,
    )

    name = {name!r}
    version = "0.0"
    priority = {priority}
    capabilities = Capabilities()


    class KVCacheManager:  # keeps what it was built with
        def __init__(self, config, event_manager=None, page_copier=None):
            self.built_with = (config, event_manager, page_copier)


    KVCacheEventManager = object


    def build_info():
        return {{"origin": "kv-api tests"}}


    def poison_reason():
        return None


    def take_poison():
        return None


    def num_live_managers():
        return 0
"""


@pytest.fixture
def install_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., None]]:
    """``install_backend(name, priority=0, *, module=None, calls_itself=None, source=None)``: a
    distribution whose entry point ``name`` names ``module`` (default ``kv_fake_<name>``),
    written from ``source`` (default ``FAKE_BACKEND`` naming itself ``calls_itself or name``);
    ``source=""`` writes no module at all."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_loaded", dict(registry._loaded))
    modules: list[str] = []

    def install(
        name: str,
        priority: object = 0,
        *,
        module: str | None = None,
        calls_itself: str | None = None,
        source: str | None = None,
    ) -> None:
        module = module or f"kv_fake_{name}"
        info = tmp_path / f"{module}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(f"[{registry.ENTRY_POINT_GROUP}]\n{name} = {module}\n")
        text = FAKE_BACKEND.format(name=calls_itself or name, priority=priority) if source is None else source
        if text:
            (tmp_path / f"{module}.py").write_text(textwrap.dedent(text))
        modules.append(module)

    yield install
    for module in modules:
        sys.modules.pop(module, None)
