"""What a backend can do beyond the core contract; conformance tests gate on these."""

from __future__ import annotations

from dataclasses import dataclass

from kv_api.constants import KEY_FORMATS

__all__ = ["Capabilities"]


@dataclass(frozen=True)
class Capabilities:
    """Defaults are what the contract requires of every backend; optional features default off.
    What a backend lacks raises ``NotImplementedError`` where it is asked for (a config naming
    it, a call); the members that read it still answer, as they do where it is not configured.

    - ``key_formats``: block-key formats the backend computes (both are required).
    - ``host_tier`` / ``disk_tier``: the backend accepts those cache tiers.
    - ``remote_tier``: the backend accepts a ``RemoteCacheTierConfig`` (a ``kv_api.BlockStore``
      below the local levels, docs/store.md).
    - ``ssm_layers``: the backend accepts ``SsmLayerConfig`` layers and ``commit_min_snapshot``.
    - ``swa_scratch``: the backend accepts ``swa_scratch_reuse`` (scratch pages of sliding-window
      layers). Without it, ``get_scratch_desc``, ``has_scratch_slots`` and
      ``enable_swa_scratch_reuse`` answer as for a config without ``swa_scratch_reuse``.
    - ``batched_calls``: the manager's batched calls (``resize_many``, ``commit_many``,
      ``admit_many``, and ``decode_steps``, made of them) are implemented.
    - ``wire_events``: its events, published by ``kv_events``, are what vLLM's consumers read
      (docs/events.md); the suite then checks them on the wire and with Dynamo's indexer.
    - ``native_buffers``: token buffers are read in place, without per-token Python objects.
    - ``sha256_transforms``: SHA-256 transforms that can be forced (native backends only).
    """

    key_formats: tuple[str, ...] = KEY_FORMATS
    host_tier: bool = False
    disk_tier: bool = False
    remote_tier: bool = False
    ssm_layers: bool = False
    swa_scratch: bool = False
    batched_calls: bool = False
    wire_events: bool = False
    native_buffers: bool = False
    sha256_transforms: tuple[str, ...] = ()
