"""Every backend raises the very same exception classes (kv_api.errors and builtins)."""

from __future__ import annotations

from typing import Any

import pytest

import kv_api

CASES: list[tuple[str, Any, type[Exception]]] = [
    ("negative token", lambda b: b.block_keys(4, None, [1, -1]), ValueError),
    ("float token", lambda b: b.block_keys(4, None, [1.0]), TypeError),
    ("short digest", lambda b: b.block_keys(4, None, [b"x" * 31]), ValueError),
    ("bad scope", lambda b: b.block_keys(4, (1, 2), [1]), TypeError),
    ("bad format", lambda b: b.block_keys(4, None, [1], "sha1"), ValueError),
    ("bad key", lambda b: b.block_hash_v2_sha256(b"short"), ValueError),
    ("manager config", lambda b: b.KVCacheManager(object()), TypeError),
]


@pytest.mark.parametrize(("call", "error"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_same_class_from_every_backend(backend: kv_api.Backend, call: Any, error: type[Exception]) -> None:
    with pytest.raises(error) as info:
        call(backend)
    assert type(info.value) is error
