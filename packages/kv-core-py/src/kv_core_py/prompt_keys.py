"""Keys a reuse report hashed past a prompt's match (mirrors prompt_keys.h): ``find_misses``
hashes the prompt's next blocks to look them up in the ghost record, and the cache's commit of
the same blocks would hash them again. The cache keeps them for its commit; a key is used only
where the block's committed tokens are the ones hashed and its parent's key is the one it was
chained from, so what a cache commits changes no key."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kv_api.keys import Token
from kv_core_py.tokens import Tokens


@dataclass
class PromptKeys:
    parent: bytes = b""  # block ``first - 1``'s key (the scope's root key for block 0)
    first: int = 0  # the first block hashed
    keys: list[bytes] = field(default_factory=list)
    tokens: list[Token] = field(default_factory=list)  # those blocks' tokens

    def keep(self, tokens: Tokens, parent: bytes, first: int, keys: list[bytes], tokens_per_block: int) -> None:
        """Keep the keys of ``tokens``' blocks ``first...`` chained from ``parent``, appending
        to those kept when they follow them."""
        if not self.keys:
            self.parent, self.first = parent, first
        elif first != self.first + len(self.keys):
            return  # not the next blocks: the kept run stays as it is
        self.keys.extend(keys)
        self.tokens.extend(tokens.to_list(first * tokens_per_block, (first + len(keys)) * tokens_per_block))

    def key(self, parent: bytes, tokens: Sequence[Token], ordinal: int) -> bytes | None:
        """Block ``ordinal``'s key where it is kept for these ``tokens`` chained from ``parent``."""
        i = ordinal - self.first
        if not 0 <= i < len(self.keys) or (self.keys[i - 1] if i else self.parent) != parent:
            return None
        n = len(tokens)
        return self.keys[i] if self.tokens[i * n : (i + 1) * n] == list(tokens) else None
