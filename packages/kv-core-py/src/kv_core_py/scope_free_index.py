"""The scope-free index (docs/manager.md, "Why a prompt missed"; opt-in with
``reuse_report_other_scope``): every full block in the tree under a second key, chained from one
root shared by all scopes, so that a prompt's missed blocks can be found cached under another
salt or LoRA id. It costs a second hash of each block committed and of each prompt missed."""

from __future__ import annotations

from kv_api.keys import Token
from kv_core_py.block_keys import chained_keys
from kv_core_py.tokens import Tokens

#: The root every scope-free chain starts from (a real scope's root is a SHA-256 digest).
SCOPE_FREE_ROOT = bytes(32)


class ScopeFreeIndex:
    def __init__(self, tokens_per_block: int, key_format: str) -> None:
        self.tokens_per_block = tokens_per_block
        self.key_format = key_format
        self._keys: dict[int, bytes] = {}  # id(block) -> its scope-free key (the tree keeps the blocks alive)
        self._counts: dict[bytes, int] = {}  # scope-free key -> blocks in the tree under it

    def added(self, block: int, parent: int | None, tokens: tuple[Token, ...]) -> None:
        """A full block (``id()``) entered the tree under ``parent`` (a full block's ``id()``, or
        None for a root)."""
        parent_key = SCOPE_FREE_ROOT if parent is None else self._keys.get(parent, SCOPE_FREE_ROOT)
        key = chained_keys(parent_key, Tokens(list(tokens), self.key_format), 0, 1, self.tokens_per_block)[1]
        self._keys[block] = key
        self._counts[key] = self._counts.get(key, 0) + 1

    def removed(self, block: int) -> None:
        """A full block (``id()``) left the tree."""
        key = self._keys.pop(block, None)
        if key is None:
            return
        left = self._counts[key] - 1
        if left:
            self._counts[key] = left
        else:
            del self._counts[key]

    def clear(self) -> None:
        self._keys.clear()
        self._counts.clear()

    def __contains__(self, key: bytes) -> bool:
        return key in self._counts
