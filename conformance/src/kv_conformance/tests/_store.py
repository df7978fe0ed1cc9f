"""A block store that records every call the manager makes (docs/store.md): two backends given
one each must record the same calls with the same keys and bytes."""

from __future__ import annotations

from collections.abc import Sequence

from kv_api import MemoryBlockStore

#: ``(method, keys, what came back or went in)``: the count for ``contains``, the values read for
#: ``get_into``, the values written for ``put``.
Call = tuple[str, list[bytes], list[bytes]]


class RecordingStore(MemoryBlockStore):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[Call] = []

    def contains(self, keys: Sequence[bytes]) -> int:
        n = super().contains(keys)
        self.calls.append(("contains", list(keys), [n.to_bytes(8, "little")]))
        return n

    def get_into(self, keys: Sequence[bytes], buffers: Sequence[memoryview]) -> int:
        n = super().get_into(keys, buffers)
        self.calls.append(("get_into", list(keys), [bytes(b) for b in buffers[:n]]))
        return n

    def put(self, keys: Sequence[bytes], values: Sequence[bytes]) -> None:
        self.calls.append(("put", list(keys), [bytes(v) for v in values]))
        super().put(keys, values)
