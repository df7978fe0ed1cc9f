"""What every report names first: the trace, the backend, the model's layout and the quotas, as
lines above a table and as fields of the JSON."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kv_replay.model import SSM, Layers, parse_layers
from kv_replay.options import ReplayOptions
from kv_replay.plural import plural
from kv_replay.sizes import format_size

__all__ = ["Setup", "layout", "quotas"]


@dataclass(frozen=True)
class Setup:
    """What was replayed, as the command line said it."""

    trace: str  # the trace as named, or "embedded workload (seed N)"
    requests: int
    layers: Layers
    tokens_per_block: int
    bytes_per_token: int

    @classmethod
    def from_options(cls, options: ReplayOptions, requests: int) -> Setup:
        trace = options.trace if options.trace is not None else f"embedded workload (seed {options.seed})"
        return cls(trace, requests, options.layers, options.tokens_per_block, options.bytes_per_token)

    @property
    def num_layers(self) -> int:
        return self.layers.count

    def layout_fields(self) -> dict[str, Any]:
        """The JSON fields of the model's layout."""
        return {
            "layers": self.layers.spec,
            "num_layers": self.num_layers,
            "tokens_per_block": self.tokens_per_block,
            "bytes_per_token": self.bytes_per_token,
        }

    def model(self) -> str:
        """``4 full-attention layers, 32 tokens per block, 256 bytes per token (K and V each, per layer)``."""
        return (
            f"{layout(self.layers)}, {plural(self.tokens_per_block, 'token')} per block, "
            f"{plural(self.bytes_per_token, 'byte')} per token (K and V each, per layer)"
        )

    def header(self, backends: str, quota_text: str) -> str:
        """The lines above a table: trace, backend(s) (as the caller words them), model, quotas."""
        return "\n".join(
            [
                f"trace: {self.trace}, {plural(self.requests, 'request')}",
                backends,
                f"model: {self.model()}",
                f"quotas: {quota_text}",
            ]
        )


def layout(layers: str | Layers) -> str:
    """A ``--layers`` spec (or its parse) in words: ``4 full-attention layers``, ``1 SSM layer``,
    or by group, ``34 layers: 24 full-attention, 8 sliding-window (window 4,096, 4 sink tokens), 2 SSM``."""
    groups = []  # (count, kind, detail)
    for count, window, sinks in layers.groups if isinstance(layers, Layers) else parse_layers(layers):
        if window == SSM:
            groups.append((count, "SSM", ""))
        elif window is None:
            groups.append((count, "full-attention", ""))
        else:
            extra = f", {plural(sinks, 'sink token')}" if sinks else ""
            groups.append((count, "sliding-window", f" (window {window:,}{extra})"))
    if len(groups) == 1:
        ((count, kind, detail),) = groups
        return f"{count:,} {kind} {'layer' if count == 1 else 'layers'}{detail}"
    total = sum(count for count, _, _ in groups)
    return f"{plural(total, 'layer')}: " + ", ".join(f"{count:,} {kind}{detail}" for count, kind, detail in groups)


def quotas(device: Sequence[int], host: Sequence[int] | None, disk: int | None, remote: str | None = None) -> str:
    """``device 128M; no host or disk tier``, ``device 64M; host 256M; disk 1G``; a list (a
    sweep) as ``device 256M, 1G (swept)``; a remote tier adds ``remote STORE``."""

    def sizes(values: Sequence[int]) -> str:
        return ", ".join(format_size(v) for v in values) + (" (swept)" if len(values) > 1 else "")

    parts = [f"device {sizes(device)}"]
    if host:
        parts.append(f"host {sizes(host)}")
    if disk is not None:
        parts.append(f"disk {format_size(disk)}")
    missing = [level for level, given in (("host", bool(host)), ("disk", disk is not None)) if not given]
    if missing:
        parts.append(f"no {' or '.join(missing)} tier")
    if remote is not None:
        parts.append(f"remote {remote}")
    return "; ".join(parts)
