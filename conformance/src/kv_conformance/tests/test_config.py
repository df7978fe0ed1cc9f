"""Managers accept only a ``KVCacheManagerConfig`` (its validation is kv-api's, tested there)."""

from __future__ import annotations

from typing import Any

import pytest

import kv_api


@pytest.mark.parametrize("config", [None, {"tokens_per_block": 32}, 32], ids=["None", "dict", "int"])
def test_manager_rejects_non_config(backend: kv_api.Backend, config: Any) -> None:
    with pytest.raises(TypeError) as info:
        backend.KVCacheManager(config)
    assert type(info.value) is TypeError
    assert str(info.value) == f"config: expected KVCacheManagerConfig, got {type(config).__name__}"
