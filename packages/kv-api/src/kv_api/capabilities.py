"""What a backend can do beyond the core contract; conformance tests gate on these."""

from __future__ import annotations

from dataclasses import dataclass

from kv_api.constants import KEY_FORMATS

__all__ = ["Capabilities"]


@dataclass(frozen=True)
class Capabilities:
    """Defaults are what the contract requires of every backend; optional features default off.

    - ``key_formats``: block-key formats the backend computes (both are required).
    - ``host_tier`` / ``disk_tier``: the backend accepts those cache tiers.
    - ``ssm_layers``: the backend accepts ``SsmLayerConfig`` layers and ``commit_min_snapshot``.
    - ``native_buffers``: token buffers are read in place, without per-token Python objects.
    - ``sha256_transforms``: SHA-256 transforms that can be forced (native backends only).
    """

    key_formats: tuple[str, ...] = KEY_FORMATS
    host_tier: bool = False
    disk_tier: bool = False
    ssm_layers: bool = False
    native_buffers: bool = False
    sha256_transforms: tuple[str, ...] = ()
