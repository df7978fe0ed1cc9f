"""Capabilities and build info: what each backend declares about itself."""

from __future__ import annotations

import pytest

import kv_api


def test_capabilities_are_declared(backend: kv_api.Backend) -> None:
    caps = backend.capabilities
    assert isinstance(caps, kv_api.Capabilities)
    assert set(kv_api.KEY_FORMATS) <= set(caps.key_formats)
    with pytest.raises(AttributeError):
        caps.host_tier = True  # type: ignore[misc]


def test_build_info_is_text(backend: kv_api.Backend) -> None:
    info = backend.build_info()
    assert info and all(isinstance(k, str) and isinstance(v, str) for k, v in info.items())


@pytest.mark.requires("sha256_transforms")
def test_native_transforms_reported(backend: kv_api.Backend) -> None:
    transforms = backend.capabilities.sha256_transforms
    assert transforms[0] == "portable"
    info = backend.build_info()
    assert info["sha256"] in transforms
    assert info["sha256_available"].split(",") == list(transforms)
    assert {"compiler", "build_type", "cxx_flags"} <= info.keys()
