"""Why a prompt missed (docs/manager.md, "Why a prompt missed"): the part of a prompt a reuse
match did not walk, split into evicted (the ghost record knows the block), partial (the tail
shorter than a block; tokens shared below a block boundary), other scope (opt-in) and never seen.
The manager counts the stale and capped parts from its match; ``KVCache.reuse_report`` joins
them with the reused tokens per level."""

from __future__ import annotations

from dataclasses import dataclass, field

from kv_api.stats import EvictedBlock, ReuseReport
from kv_core_py.block_keys import chained_keys
from kv_core_py.prompt_keys import PromptKeys
from kv_core_py.radix_tree import PARTIAL_SCAN_LIMIT, Block, Node, RadixTree, common_prefix
from kv_core_py.scope_free_index import SCOPE_FREE_ROOT
from kv_core_py.tokens import Tokens


@dataclass
class Misses:
    """A prompt's tokens not reused, by reason (``ReuseReport``'s ``miss_*`` fields)."""

    num_prompt_tokens: int
    stale: int = 0
    capped: int = 0
    evicted: int = 0
    partial: int = 0
    never_seen: int = 0
    other_scope: int = 0
    evicted_blocks: tuple[EvictedBlock, ...] = ()
    keys: PromptKeys = field(default_factory=PromptKeys)  # the blocks hashed past the walk, for the commit

    def report(self, reused_tokens_by_level: list[int]) -> ReuseReport:
        return ReuseReport(
            self.num_prompt_tokens,
            tuple(reused_tokens_by_level),
            self.stale,
            self.capped,
            self.evicted,
            self.partial,
            self.never_seen,
            self.other_scope,
            self.evicted_blocks,
        )


def find_misses(
    tree: RadixTree, root_key: bytes, tokens: Tokens, walked: int, parent: Block | None, partial_reuse: bool
) -> Misses:
    """The tokens past the ``walked`` ones, by reason. ``parent``: the walk's last full block
    before them (None: the root). Blocks the ghost record knows come first; the first block it
    does not know and every later one were never in this scope's tree (a block's parent stays
    while it has children, and is forgotten after them), unless another scope holds them."""
    tokens_per_block = tree.tokens_per_block
    length = len(tokens)
    full = length // tokens_per_block
    misses = Misses(length, partial=length - max(walked, full * tokens_per_block))
    pos = walked  # the first token not accounted for
    ordinal = walked // tokens_per_block
    key = parent.key if parent is not None else root_key  # block ``ordinal - 1``'s
    ghost = tree.ghost
    evicted: list[EvictedBlock] = []
    keys: list[bytes] = []  # blocks ``ordinal...``'s keys, hashed 1, 2, 4... at a time (calls cost here)
    while ordinal < full and ghost is not None and len(ghost):
        if not keys:
            batch = chained_keys(key, tokens, ordinal, min(2 * len(evicted) + 1, 64, full - ordinal), tokens_per_block)
            misses.keys.keep(tokens, key, ordinal, batch[1:], tokens_per_block)
            keys = batch[:0:-1]
        key = keys.pop()
        entry = ghost.find(key)
        if entry is None:
            break
        # blocks evicted together share one (frozen, equal) record: a long prompt has thousands
        evicted.append(
            evicted[-1] if evicted and (evicted[-1].level, evicted[-1].age) == entry else EvictedBlock(*entry)
        )
        ordinal += 1
        misses.evicted += ordinal * tokens_per_block - pos
        pos = ordinal * tokens_per_block
    misses.evicted_blocks = tuple(evicted)
    if ordinal >= full:
        return misses
    if pos == walked and pos % tokens_per_block == 0 and not partial_reuse:
        node: Node | None = parent if parent is not None else tree.roots.get(root_key)
        lost = _shared_below_boundary(node, tokens, ordinal, tokens_per_block)
        misses.partial += lost
        pos += lost
    if tree.scope_free is not None:
        pos = _other_scope(tree, tokens, ordinal, full, pos, misses)
    misses.never_seen = full * tokens_per_block - pos
    return misses


def _shared_below_boundary(node: Node | None, tokens: Tokens, ordinal: int, tokens_per_block: int) -> int:
    """The most tokens of block ``ordinal`` a child of ``node`` starts with (what partial reuse
    would have matched); 0 where the walk would not scan (too many children)."""
    if node is None or len(node.children) >= PARTIAL_SCAN_LIMIT:
        return 0
    chunk = tokens.to_list(ordinal * tokens_per_block, (ordinal + 1) * tokens_per_block)
    return max((common_prefix(child.tokens, chunk) for child in node.children.values()), default=0)


def _other_scope(tree: RadixTree, tokens: Tokens, ordinal: int, full: int, pos: int, misses: Misses) -> int:
    """Count the blocks from ``ordinal`` on that another scope holds (stopping at the first it
    does not); the first token past them."""
    index = tree.scope_free
    assert index is not None
    tokens_per_block = tree.tokens_per_block
    key = chained_keys(SCOPE_FREE_ROOT, tokens, 0, ordinal, tokens_per_block)[-1]
    while ordinal < full:
        key = chained_keys(key, tokens, ordinal, 1, tokens_per_block)[1]
        if key not in index:
            break
        ordinal += 1
        misses.other_scope += ordinal * tokens_per_block - pos
        pos = ordinal * tokens_per_block
    return pos
