"""Reuse scopes and multimodal item contexts: what a block key is computed from besides tokens."""

from __future__ import annotations

from dataclasses import dataclass

from kv_api._check import optional_u64

__all__ = ["DIGEST_SIZE", "MmItemContext", "ReuseScope"]

#: Size of a block key and of a multimodal digest token, in bytes.
DIGEST_SIZE = 32


@dataclass(frozen=True, slots=True)
class ReuseScope:
    """Blocks match only within one scope: one LoRA adapter and one tenant salt.

    Both fields are optional unsigned 64-bit ints; ``None`` (absent) is distinct from ``0``.
    """

    lora_id: int | None = None
    salt: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "lora_id", optional_u64("ReuseScope.lora_id", self.lora_id))
        object.__setattr__(self, "salt", optional_u64("ReuseScope.salt", self.salt))


@dataclass(frozen=True, slots=True)
class MmItemContext:
    """A multimodal item's digest token; ``uuid`` is carried for events and never hashed."""

    digest: bytes
    uuid: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.digest, bytes):
            raise TypeError(f"MmItemContext.digest: expected bytes, got {type(self.digest).__name__}")
        if len(self.digest) != DIGEST_SIZE:
            raise ValueError(f"MmItemContext.digest: must be {DIGEST_SIZE} bytes (got {len(self.digest)})")
        if self.uuid is not None and not isinstance(self.uuid, str):
            raise TypeError(f"MmItemContext.uuid: expected str or None, got {type(self.uuid).__name__}")

    def __eq__(self, other: object) -> bool:
        # The uuid takes no part in equality, as it takes none in hashing.
        if not isinstance(other, MmItemContext):
            return NotImplemented
        return self.digest == other.digest

    def __hash__(self) -> int:
        return hash(self.digest)
