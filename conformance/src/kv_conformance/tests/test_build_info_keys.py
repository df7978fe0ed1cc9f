"""What every backend's ``build_info()`` reports (``kv_api.Backend.build_info``: "compiler,
flags, SHA-256 transform, ..."): free-form text, but the SHA-256 implementation in use always
under the key ``sha256``. Kills mutants of ``kv_core_py.build_info`` renaming that key."""

from __future__ import annotations

import kv_api


def test_build_info_names_the_sha256_in_use(backend: kv_api.Backend) -> None:
    info = backend.build_info()
    assert isinstance(info.get("sha256"), str) and info["sha256"]
