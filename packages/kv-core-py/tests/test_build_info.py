"""The Python backend's build info: its SHA-256 is ``hashlib`` (docs/architecture.md)."""

from __future__ import annotations

import kv_core_py


def test_build_info_names_hashlib_as_the_sha256() -> None:
    assert kv_core_py.build_info()["sha256"] == "hashlib"
