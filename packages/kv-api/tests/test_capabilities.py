"""Capabilities a backend declares start from the contract minimum."""

from __future__ import annotations

import kv_api


def test_default_capabilities_are_the_contract_minimum() -> None:
    caps = kv_api.Capabilities()
    assert not (caps.host_tier or caps.disk_tier or caps.ssm_layers or caps.native_buffers)
    assert caps.sha256_transforms == ()
