"""The radix tree of committed blocks, keyed by chained block keys (docs/key-format.md).

Each scope has its own root (keyed by the root key), so scopes never share blocks. A block
holds up to one page per layer group; a page's ``num_tokens`` says how many of the block's
tokens it is valid for. No child's tokens are a proper prefix of a sibling's (docs/manager.md,
"Reuse"). Children keep insertion order, which decides ties when a partial match scans
siblings, so every backend picks the same block.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import cast

from kv_api.keys import Token
from kv_api.scope import ReuseScope
from kv_core_py.block_keys import chained_keys
from kv_core_py.ghost_record import GhostRecord
from kv_core_py.page import Page
from kv_core_py.scope_free_index import ScopeFreeIndex
from kv_core_py.tokens import Tokens

#: Siblings are scanned for a partial match only when there are fewer than this many.
PARTIAL_SCAN_LIMIT = 32
#: Blocks hashed ahead while walking: a miss wastes at most this many.
KEY_BATCH = 64


class Node:
    __slots__ = ("children", "key", "parent", "partial_children")

    def __init__(self, key: bytes, parent: Node | None) -> None:
        self.key = key
        self.parent = parent
        self.children: dict[bytes, Block] = {}
        # How many children hold fewer tokens than a full block: a commit looks for a partial
        # sibling its block extends, and a node with thousands of full children (a scope's
        # root) has none to scan. The tree keeps it as it adds and removes children.
        self.partial_children = 0


class Root(Node):
    __slots__ = ("scope",)

    def __init__(self, key: bytes, scope: ReuseScope) -> None:
        super().__init__(key, None)
        self.scope = scope


class Block(Node):
    __slots__ = ("lora_id", "ordinal", "pages", "pins", "tokens", "v1_hash")

    def __init__(
        self, key: bytes, parent: Node, tokens: tuple[Token, ...], ordinal: int, num_layer_groups: int
    ) -> None:
        super().__init__(key, parent)
        # The scope's LoRA adapter, for events (the root knows the scope; blocks copy it down).
        self.lora_id: int | None = parent.scope.lora_id if isinstance(parent, Root) else cast(Block, parent).lora_id
        self.tokens = tokens
        self.ordinal = ordinal
        self.pages: list[Page | None] = [None] * num_layer_groups
        self.v1_hash: tuple[int, bool] | None = None  # cached by the event manager
        self.pins = 0  # open caches whose next commits hang under this block: never pruned

    def has_pages(self) -> bool:
        return any(p is not None for p in self.pages)


def common_prefix(a: Sequence[Token], b: Sequence[Token]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def is_proper_prefix(a: tuple[Token, ...], b: tuple[Token, ...]) -> bool:
    return len(a) < len(b) and b[: len(a)] == a


class RadixTree:
    def __init__(self, num_layer_groups: int, tokens_per_block: int) -> None:
        self.roots: dict[bytes, Root] = {}
        self.num_layer_groups = num_layer_groups
        self.tokens_per_block = tokens_per_block
        # What the reuse report reads (reuse_report.py); set by the manager where configured.
        self.ghost: GhostRecord | None = None
        self.scope_free: ScopeFreeIndex | None = None

    def walk(self, root_key: bytes, tokens: Tokens, tokens_per_block: int, partial: bool) -> list[tuple[Block, int]]:
        """The longest chain of blocks matching ``tokens``: ``(block, matched tokens)`` per block.

        Whole blocks match by key; at the first miss (or the partial tail), with ``partial``,
        the last matched node's children are scanned (if fewer than 32) for the longest common
        token prefix, first in insertion order on ties. Coverage is not checked here.
        """
        node: Node | None = self.roots.get(root_key)
        path: list[tuple[Block, int]] = []
        if node is None:
            return path
        num_tokens = len(tokens)
        keys: list[bytes] = []  # block ``batch + i``'s key is ``keys[i + 1]``
        batch = 0
        for b, start in enumerate(range(0, num_tokens, tokens_per_block)):
            if b - batch + 1 >= len(keys):  # node.key is block b - 1's key
                batch = b
                keys = chained_keys(node.key, tokens, b, KEY_BATCH, tokens_per_block)
            length = min(tokens_per_block, num_tokens - start)
            child = node.children.get(keys[b - batch + 1])
            if child is not None:
                path.append((child, length))
                if length == tokens_per_block:
                    node = child
                    continue
                break
            if partial and len(node.children) < PARTIAL_SCAN_LIMIT:
                chunk = tokens.to_list(start, start + length)
                best, best_len = None, 0
                for candidate in node.children.values():
                    n = common_prefix(candidate.tokens, chunk)
                    if n > best_len:
                        best, best_len = candidate, n
                if best is not None:
                    path.append((best, best_len))
            break
        return path

    def root(self, root_key: bytes, scope: ReuseScope) -> Root:
        node = self.roots.get(root_key)
        if node is None:
            node = self.roots[root_key] = Root(root_key, scope)
        return node

    def add(self, parent: Node, key: bytes, tokens: tuple[Token, ...], ordinal: int) -> Block:
        block = Block(key, parent, tokens, ordinal, self.num_layer_groups)
        parent.children[key] = block
        if len(tokens) < self.tokens_per_block:
            parent.partial_children += 1
        else:
            if self.ghost is not None:
                self.ghost.forget(key)
            if self.scope_free is not None:
                self.scope_free.added(id(block), id(parent) if isinstance(parent, Block) else None, tokens)
        return block

    @staticmethod
    def covering_sibling(parent: Node, tokens: tuple[Token, ...]) -> Block | None:
        """A child of ``parent`` whose tokens strictly extend ``tokens``: a partial block of
        ``tokens`` beside it would hold nothing it does not."""
        for child in parent.children.values():
            if is_proper_prefix(tokens, child.tokens):
                return child
        return None

    @staticmethod
    def covered_sibling(parent: Node, tokens: tuple[Token, ...]) -> Block | None:
        """The partial child of ``parent`` whose tokens ``tokens`` strictly extend. There is at
        most one: a partial block is never added beside a child extending it, and a block added
        beside a partial child it extends replaces that child. Only a node with partial
        children is scanned."""
        if not parent.partial_children:
            return None
        for child in parent.children.values():
            if is_proper_prefix(child.tokens, tokens):
                return child
        return None

    @staticmethod
    def subtree(block: Block) -> Iterator[Block]:
        """``block`` and its descendants, parents before children, children in insertion order."""
        stack = [block]
        while stack:
            b = stack.pop()
            yield b
            stack.extend(reversed(list(b.children.values())))

    def detach(self, block: Block, level: int | None = None) -> None:
        """Take ``block`` and its subtree out of the tree; ``level``: the cache level an eviction
        dropped it from (None: not an eviction, the ghost record is not told)."""
        assert block.parent is not None
        self._take_child(block.parent, block)
        if block.children:
            self._left(reversed(list(RadixTree.subtree(block))), level)
        else:
            self._left((block,), level)

    def prune(self, node: Node, level: int | None = None) -> None:
        """Remove ``node`` and its ancestors while they have no children, no page in any life
        cycle and no open cache building on them; a root without children is dropped.
        ``level`` as for ``detach``."""
        while isinstance(node, Block) and not node.children and not node.has_pages() and not node.pins:
            parent = node.parent
            assert parent is not None
            self._take_child(parent, node)
            self._left((node,), level)
            node = parent
        if isinstance(node, Root) and not node.children:
            self.roots.pop(node.key, None)

    def clear(self) -> None:
        """Every block leaves (not evicted: the ghost record keeps what it knew)."""
        self.roots.clear()
        if self.scope_free is not None:
            self.scope_free.clear()

    def _left(self, blocks: Iterable[Block], level: int | None) -> None:
        """``blocks`` left the tree (descendants before ancestors): the ghost record and the
        scope-free index hear of their full ones."""
        ghost = self.ghost if level is not None else None
        if ghost is None and self.scope_free is None:
            return
        for block in blocks:
            if len(block.tokens) == self.tokens_per_block:
                if ghost is not None:
                    ghost.record(block.key, cast(int, level))
                if self.scope_free is not None:
                    self.scope_free.removed(id(block))

    def _take_child(self, parent: Node, block: Block) -> None:
        del parent.children[block.key]
        parent.partial_children -= len(block.tokens) < self.tokens_per_block
