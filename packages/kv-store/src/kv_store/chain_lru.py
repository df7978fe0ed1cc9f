"""``RedisBlockStore``'s chain-aware LRU (``order_chains``). A block is only useful while every
block before it in its chain is stored, but the server's LRU (a clock in seconds, sampled eviction) evicts the
blocks of a chain in random order, and its first blocks first when a manager that has them
locally writes only the rest. So the store keeps its own LRU on the server, exact and chain
aware: a sorted set (``index_key``) scores each block by when it or a block after it in its chain
was last read or written, less a microsecond per prefix token. A block then always scores below
its ancestors, and before each write a script deletes the lowest scored blocks until the write
fits under ``maxmemory``: chains are cut from the tail and the server's own eviction is a
backstop. The scores of a block's ancestors come from a walk up the chain (``read_header``'s
parent in each value's header), which stops at an ancestor scored less than ``touch_window_s`` ago; the
blocks below it score no higher than it. A write whose parent is not stored is deleted again
(nothing could reach it). A read's touch rides in the read's own pipeline, after its MGET."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

from kv_api.block_value import read_place

__all__ = ["CHAINED_KEY_SIZE", "CHAIN_SCRIPT", "Chain", "ChainScript", "hangs_under"]

log = logging.getLogger(__name__)

CHAINED_KEY_SIZE = 32  # a store key ends with the block's chained key, the header's ``key``

# ARGV: index key, bytes to make room for (0: none), most ancestors to walk per chain, window
# (s), TTL in ms (0: none), 2 to score blocks about to be written or 1 to touch stored ones, the
# bytes the values take; then, to score, per chain its namespace, its first
# block's parent's chained key ('' for a chain's first block), its block count n and n pairs of
# a block's key and prefix tokens (a pipeline's chains in one call: the server's memory read
# once, one call's overhead); to touch, the keys of one chain's blocks. A touch reads each
# block's prefix tokens, and the first one's parent, from the stored value, stops at the first
# block not stored, and does nothing when the last block was scored less than a window ago. The
# values themselves are not arguments: the writer pipelines its SET NXs right after the script
# (a value passed through Lua is copied twice more on the server: a put took 3x plain SETs).
# Returns {blocks deleted, 1 if the server stayed full (noeviction: nothing should be written)
# else 0, then per chain 1 if it is whole from its first block (or cannot be told) else 0}.
# Header offsets (block_value): key 40, parent 72, prefix tokens 104 (u64 LE), block tokens 112
# (u32 LE). allow-oom: at maxmemory under noeviction it still frees room.
CHAIN_SCRIPT = """#!lua flags=allow-oom
local index, need = ARGV[1], tonumber(ARGV[2])
local walk, window, ttl, stride = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local size = tonumber(ARGV[7])
local function int(s, first, last)
  local n = 0
  for i = last, first, -1 do n = n * 256 + string.byte(s, i) end
  return n
end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local function recent(name, tokens)  -- scored less than a window ago
  local score = redis.call('ZSCORE', index, name)
  return score and tonumber(score) + tokens * 1e-6 >= now - window
end
local chains = {}  -- per chain: its namespace, its parent's key, and per block its prefix tokens, its key
if stride == 2 then
  local i = 8
  while i <= #ARGV do
    local chain = {ARGV[i], ARGV[i + 1], {}}
    for j = i + 3, i + 2 + 2 * tonumber(ARGV[i + 2]), 2 do
      chain[3][#chain[3] + 1] = tonumber(ARGV[j + 1])
      chain[3][#chain[3] + 1] = ARGV[j]
    end
    chains[#chains + 1] = chain
    i = i + 3 + 2 * tonumber(ARGV[i + 2])
  end
else
  -- the last block first: scored within the window, the ones before it were too
  local head = redis.call('GETRANGE', ARGV[#ARGV], 0, 115)
  if #head == 116 and string.sub(head, 1, 4) == 'KVCB' and recent(ARGV[#ARGV], int(head, 105, 112)) then
    return {0, 0, 1}
  end
  local chain = {'', '', {}}
  for i = 8, #ARGV do
    local head = redis.call('GETRANGE', ARGV[i], 0, 115)
    if #head < 116 or string.sub(head, 1, 4) ~= 'KVCB' then break end
    local tokens = int(head, 105, 112)
    if i == 8 then  -- the chain's namespace and the first block's parent
      chain[1] = string.sub(ARGV[i], 1, #ARGV[i] - 32)
      if int(head, 113, 116) ~= tokens then chain[2] = string.sub(head, 73, 104) end
    end
    chain[3][#chain[3] + 1] = tokens
    chain[3][#chain[3] + 1] = ARGV[i]
  end
  local blocks = chain[3]
  if #blocks == 0 or recent(blocks[#blocks], blocks[#blocks - 1]) then return {0, 0, 1} end
  chains[1] = chain
end
local deleted, full = 0, 0
if ttl > 0 then  -- members whose block expired (what the server evicts, making room pops)
  for _, name in ipairs(redis.call('ZRANGE', index, 0, 1)) do
    if redis.call('EXISTS', name) == 0 then redis.call('ZREM', index, name) end
  end
end
if need > 0 then
  local info = redis.call('INFO', 'memory')
  local used = tonumber(string.match(info, 'used_memory:(%d+)'))
  local limit = tonumber(string.match(info, 'maxmemory:(%d+)'))
  local pops = 0
  while limit > 0 and used + need > limit - limit / 64 and pops < 4096 do
    local low = redis.call('ZPOPMIN', index)
    if #low == 0 then break end
    used = used - redis.call('STRLEN', low[1]) - #low[1] - 64
    deleted = deleted + redis.call('DEL', low[1])
    pops = pops + 1
  end
  if limit > 0 and used + size > limit and string.match(info, 'maxmemory_policy:noeviction') then full = 1 end
end
local answer = {deleted, full}
local scores = {}  -- ZADD's arguments: score, member, ...
local scored = {}  -- the blocks of this call's whole chains, to their base: not stored yet (their
-- SET NXs follow the script), but a later chain of the call may hang under one of them
-- Per chain: its ancestors up to one scored within the window (the base), then its blocks,
-- each scored a microsecond per prefix token below the base.
local function score(ns, key, blocks)
  local base, left, path = now, walk, {}
  while key ~= '' and left > 0 do
    local name = ns .. key
    if scored[name] then
      base = scored[name]
      break
    end
    local head = redis.call('GETRANGE', name, 0, 115)
    if #head < 116 then return 0 end
    if string.sub(head, 1, 4) ~= 'KVCB' or string.sub(head, 41, 72) ~= key then break end
    local tokens = int(head, 105, 112)
    local last = redis.call('ZSCORE', index, name)
    if last and tonumber(last) + tokens * 1e-6 >= now - window then
      base = math.min(now, tonumber(last) + tokens * 1e-6)
      break
    end
    path[#path + 1] = tokens
    path[#path + 1] = name
    if int(head, 113, 116) == tokens then break end  -- a chain's first block
    key = string.sub(head, 73, 104)
    left = left - 1
  end
  for i = 1, #blocks do path[#path + 1] = blocks[i] end
  for i = 2, #blocks, 2 do scored[blocks[i]] = base end
  for i = 1, #path, 2 do
    scores[#scores + 1] = string.format('%.6f', base - path[i] * 1e-6)
    scores[#scores + 1] = path[i + 1]
  end
  return 1
end
for i = 1, #chains do
  answer[#answer + 1] = full == 1 and 1 or score(chains[i][1], chains[i][2], chains[i][3])
end
-- every chain's scores in few calls (a call per chain was a third of a decode step's script)
for i = 1, #scores, 256 do redis.call('ZADD', index, unpack(scores, i, math.min(i + 255, #scores))) end
return answer
"""


@dataclasses.dataclass(frozen=True)
class Chain:
    """What the chain script needs of a batch: its namespace, its first block's parent (b"" for
    a chain's first block) and each block's prefix tokens."""

    namespace: bytes
    parent: bytes
    tokens: list[int]

    @staticmethod
    def runs(keys: Sequence[bytes], values: Sequence[bytes | memoryview]) -> list[tuple[Chain | None, int]]:
        """``keys`` / ``values`` cut into their chains, in order (a batched commit's put holds
        many), each with its block count; a value that is not a block value of its key is a run
        of its own, with None."""
        runs: list[tuple[Chain | None, int]] = []
        chain: Chain | None = None
        count = 0
        for i, (key, value) in enumerate(zip(keys, values, strict=True)):
            place = _place(key, value)
            if place is not None and chain is not None and hangs_under(keys[i - 1], key, place[1]):
                chain.tokens.append(place[2])
                count += 1
                continue
            if count:
                runs.append((chain, count))
            if place is None:
                runs.append((None, 1))
                chain, count = None, 0
            else:
                parent = b"" if place[2] == place[3] else place[1]  # b"": a chain's first block
                chain, count = Chain(bytes(key[:-CHAINED_KEY_SIZE]), parent, [place[2]]), 1
        if count:
            runs.append((chain, count))
        return runs

    def extend(self, last_key: bytes, keys: Sequence[bytes], values: Sequence[bytes | memoryview]) -> bool:
        """Add the blocks of ``keys`` / ``values`` where they continue this chain, whose last
        block is at store key ``last_key``: each value a block value of its key, each block the
        child of the one before it, in the chain's namespace. False (nothing added) where not."""
        tokens: list[int] = []
        for key, value in zip(keys, values, strict=True):
            place = _place(key, value)
            if place is None or not hangs_under(last_key, key, place[1]):
                return False
            tokens.append(place[2])
            last_key = key
        self.tokens.extend(tokens)
        return True


def _place(key: bytes, value: bytes | memoryview) -> tuple[bytes, bytes, int, int] | None:
    """``read_place`` of ``value`` where it is the block value of store key ``key``, else None."""
    place = read_place(value)
    if place is None or len(key) <= CHAINED_KEY_SIZE or key[-CHAINED_KEY_SIZE:] != place[0]:
        return None
    return place


def hangs_under(last_key: bytes, key: bytes, parent: bytes) -> bool:
    """Whether the block at store key ``key``, whose parent's chained key is ``parent``, is the
    child of the block at store key ``last_key`` (one namespace): a batch that starts with it
    continues a batch that ends with that one."""
    return parent == last_key[-CHAINED_KEY_SIZE:] and key[:-CHAINED_KEY_SIZE] == last_key[:-CHAINED_KEY_SIZE]


class ChainScript:
    """The chain script on one server (``client``, a ``redis.Redis``): loaded once, and again after
    the server lost it (a restart); ``on`` until the server has refused it three times in a row
    (an ACL without scripts, scripting off: not a fault), then the store goes on without its LRU,
    on the server's eviction alone. ``name`` and ``describe`` (a refusal) are for the log, with no
    secret."""

    def __init__(self, client: Any, on: bool, name: str, describe: Callable[[BaseException], str]) -> None:
        import redis

        self.on = on
        self._name = name
        self._client = client
        self._describe = describe
        self._sha: str | None = None
        self._refusals = 0  # refusals in a row
        self._no_script: type[BaseException] = redis.exceptions.NoScriptError
        self._refused: type[BaseException] = redis.exceptions.ResponseError
        self._full: type[BaseException] = redis.exceptions.OutOfMemoryError

    def sha(self) -> str | None:
        """The script's SHA for EVALSHA; None where it is off or the server refuses it. An OOM
        reply to loading it raises."""
        if self.on and self._sha is None:
            try:
                self._sha = str(self._client.script_load(CHAIN_SCRIPT))
            except self._refused as exc:
                if isinstance(exc, self._full):
                    raise
                self._refuse(exc)
        return self._sha if self.on else None

    def answer(self, reply: object) -> list[int] | None:
        """The script's answer among a pipeline's replies; None where it did not run: the server
        lost it (loaded again next time) or refuses it (counted). An OOM reply raises."""
        if reply is None:
            return None
        if isinstance(reply, self._no_script):
            self._sha = None
            return None
        if isinstance(reply, self._refused) and not isinstance(reply, self._full) and "OOM" not in str(reply):
            self._refuse(reply)
            return None
        if isinstance(reply, BaseException):
            raise reply
        self._refusals = 0
        assert isinstance(reply, list)
        return [int(x) for x in reply]

    def _refuse(self, exc: BaseException) -> None:
        self._refusals += 1
        if self._refusals >= 3:
            self.on = False
            log.warning("%s: chain LRU off (%s)", self._name, self._describe(exc))
