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

# ARGV: index key, bytes to make room for (0: none), namespace and parent's chained key ('' for
# a chain's first block; both ignored by a touch), most ancestors to walk, window (s), TTL in ms (0:
# none), 2 to score blocks about to be written or 1 to touch stored ones, the bytes the values
# take, then per block its key and (to score) its prefix tokens. A touch reads each block's
# prefix tokens, and the first one's parent, from the stored value, stops at the first block
# not stored, and does nothing when the last block was scored less than a window ago. The
# values themselves are not arguments: the writer pipelines its SET NXs right after the script
# (a value passed through Lua is copied twice more on the server: a put took 3x plain SETs).
# Returns {1 if the chain is whole from its first block (or cannot be told) else 0, blocks
# deleted, 1 if the server stayed full (noeviction: nothing should be written) else 0}. Header
# offsets (block_value): key 40, parent 72, prefix tokens 104 (u64 LE), block tokens 112 (u32
# LE). allow-oom: at maxmemory under noeviction it still frees room.
CHAIN_SCRIPT = """#!lua flags=allow-oom
local index, need, ns, key = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local left, window, ttl, stride = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local size = tonumber(ARGV[9])
local function int(s, first, last)
  local n = 0
  for i = last, first, -1 do n = n * 256 + string.byte(s, i) end
  return n
end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local blocks = {}  -- per block: its prefix tokens, its key
if stride == 2 then
  for i = 10, #ARGV, 2 do
    blocks[#blocks + 1] = tonumber(ARGV[i + 1])
    blocks[#blocks + 1] = ARGV[i]
  end
else
  -- the last block first: scored within the window, the ones before it were too
  local head = redis.call('GETRANGE', ARGV[#ARGV], 0, 115)
  if #head == 116 and string.sub(head, 1, 4) == 'KVCB' then
    local last = redis.call('ZSCORE', index, ARGV[#ARGV])
    if last and tonumber(last) + int(head, 105, 112) * 1e-6 >= now - window then return {1, 0, 0} end
  end
  for i = 10, #ARGV do
    local head = redis.call('GETRANGE', ARGV[i], 0, 115)
    if #head < 116 or string.sub(head, 1, 4) ~= 'KVCB' then break end
    local tokens = int(head, 105, 112)
    if i == 10 then  -- the chain's namespace and the first block's parent
      ns, key = string.sub(ARGV[i], 1, #ARGV[i] - 32), ''
      if int(head, 113, 116) ~= tokens then key = string.sub(head, 73, 104) end
    end
    blocks[#blocks + 1] = tokens
    blocks[#blocks + 1] = ARGV[i]
  end
  if #blocks == 0 then return {1, 0, 0} end
  local last = redis.call('ZSCORE', index, blocks[#blocks])
  if last and tonumber(last) + blocks[#blocks - 1] * 1e-6 >= now - window then return {1, 0, 0} end
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
local base, whole, path = now, 1, {}
while key ~= '' and left > 0 do
  local name = ns .. key
  local head = redis.call('GETRANGE', name, 0, 115)
  if #head < 116 then whole = 0; break end
  if string.sub(head, 1, 4) ~= 'KVCB' or string.sub(head, 41, 72) ~= key then break end
  local tokens = int(head, 105, 112)
  local score = redis.call('ZSCORE', index, name)
  if score and tonumber(score) + tokens * 1e-6 >= now - window then
    base = math.min(now, tonumber(score) + tokens * 1e-6)
    break
  end
  path[#path + 1] = tokens
  path[#path + 1] = name
  if int(head, 113, 116) == tokens then break end  -- a chain's first block
  key = string.sub(head, 73, 104)
  left = left - 1
end
if whole == 0 or full == 1 then return {whole, deleted, full} end
for i = 1, #blocks do path[#path + 1] = blocks[i] end
for i = 1, #path, 2 do path[i] = string.format('%.6f', base - path[i] * 1e-6) end
for i = 1, #path, 256 do redis.call('ZADD', index, unpack(path, i, math.min(i + 255, #path))) end
return {1, deleted, 0}
"""


@dataclasses.dataclass(frozen=True)
class Chain:
    """What the chain script needs of a batch: its namespace, its first block's parent (b"" for
    a chain's first block) and each block's prefix tokens."""

    namespace: bytes
    parent: bytes
    tokens: list[int]

    @staticmethod
    def of(keys: Sequence[bytes], values: Sequence[bytes | memoryview]) -> Chain | None:
        """None unless every value is a block value of its key (``read_place``)."""
        tokens: list[int] = []
        parent = b""
        for n, (key, value) in enumerate(zip(keys, values, strict=False)):
            place = read_place(value)
            if place is None or len(key) <= CHAINED_KEY_SIZE or key[-CHAINED_KEY_SIZE:] != place[0]:
                return None
            if n == 0 and place[2] != place[3]:  # not a chain's first block
                parent = place[1]
            tokens.append(place[2])
        return Chain(bytes(keys[0][:-CHAINED_KEY_SIZE]), parent, tokens)


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
