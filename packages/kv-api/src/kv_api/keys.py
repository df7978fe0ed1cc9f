"""Block keys: the reference implementation of docs/key-format.md, written for clarity.

Backends implement the same functions natively and must return byte-identical results,
raise the same exception classes and (where practical) the same messages.

A block key chains: ``root = SHA256(scope bytes)``, ``key[i] = SHA256(key[i-1] || token bytes
of block i)``. An int token is 4 (``sha256-u32``) or 8 (``sha256-u64``) bytes little-endian; a
multimodal digest token is its 32 raw bytes. The partial last block hashes only its tokens.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal, TypeAlias, TypeVar, cast

from kv_api._check import U64_LIMIT, as_int, as_str, int_in_range, optional_u64
from kv_api.constants import DEFAULT_KEY_FORMAT, KEY_FORMATS, SHA256_U32, SHA256_U64, TOKEN_LIMIT
from kv_api.scope import DIGEST_SIZE, MmItemContext, ReuseScope

__all__ = [
    "DEFAULT_KEY_FORMAT",
    "KEY_FORMATS",
    "Token",
    "block_hash_v1",
    "block_hash_v2_sha256",
    "block_hash_v2_sha256_64",
    "block_keys",
    "block_keys_many",
    "cache_salt_to_id",
    "check_digest",
    "check_key_format",
    "check_many_inputs",
    "check_many_scopes",
    "check_mm_item",
    "check_reuse_scope",
    "gen_multimodal_cache_key_tokens",
    "named_item",
    "reuse_scope_to_bytes",
    "sequence_to_blockchain_keys",
    "token_list",
    "v1_token_ids",
]

#: Per key format: (bytes per int token, exclusive upper bound of an int token id).
TOKEN_ENCODING = {SHA256_U32: (4, 1 << 31), SHA256_U64: (8, 1 << 64)}
_RANGE_TEXT = {SHA256_U32: "0 <= id < 2**31", SHA256_U64: "0 <= id < 2**64"}

#: A normalised token: an int id or a 32-byte digest.
Token: TypeAlias = int | bytes

_INT_FORMATS = frozenset("bBhHiIlLqQnN")
_LITTLE_ENDIAN = struct.pack("=H", 1) == b"\x01\x00"


# --- argument checks (shared wording with every backend) ---------------------------------


def check_key_format(key_format: Any) -> str:
    fmt = as_str("key_format", key_format)
    if fmt not in TOKEN_ENCODING:
        raise ValueError(f"key_format: unknown {fmt!r} (expected one of {', '.join(KEY_FORMATS)})")
    return fmt


def check_digest(where: str, value: Any) -> bytes:
    """A 32-byte ``bytes`` (a block key or a multimodal digest), else TypeError / ValueError."""
    if not isinstance(value, bytes):
        raise TypeError(f"{where}: expected bytes, got {type(value).__name__}")
    if len(value) != DIGEST_SIZE:
        raise ValueError(f"{where}: must be {DIGEST_SIZE} bytes (got {len(value)})")
    return value


def check_reuse_scope(reuse_scope: Any) -> ReuseScope:
    if reuse_scope is None:
        return ReuseScope()
    if not isinstance(reuse_scope, ReuseScope):
        raise TypeError(f"reuse_scope: expected ReuseScope or None, got {type(reuse_scope).__name__}")
    # Checked again as __post_init__ checks them: a scope built past it (object.__new__,
    # object.__setattr__) may hold anything, and every backend must refuse it alike.
    lora_id = optional_u64("ReuseScope.lora_id", reuse_scope.lora_id)
    salt = optional_u64("ReuseScope.salt", reuse_scope.salt)
    if lora_id is reuse_scope.lora_id and salt is reuse_scope.salt:
        return reuse_scope
    return ReuseScope(lora_id, salt)


def token_out_of_range(position: int, value: int, key_format: str) -> ValueError:
    return ValueError(f"token {position}: id {value} out of range for {key_format} ({_RANGE_TEXT[key_format]})")


def buffer_format_error(fmt: str, itemsize: int) -> TypeError:
    return TypeError(
        f"tokens: a token buffer must hold 4- or 8-byte integers in native byte order "
        f"(got format {fmt!r}, itemsize {itemsize})"
    )


# --- token ingestion -----------------------------------------------------------------------


def buffer_int_code(mv: memoryview) -> Literal["i", "I", "q", "Q"]:
    """The ``struct`` code ('i', 'I', 'q' or 'Q') to read a token buffer with, or TypeError.

    Decided from the format's kind (signed / unsigned integer) and its item size together,
    never from the letter alone ('l' is 8 bytes here and 4 on Windows).
    """
    fmt = mv.format
    order, letter = (fmt[0], fmt[1:]) if fmt[:1] in "@=<>!" else ("@", fmt)
    native = order in "@=" or (order == "<") == _LITTLE_ENDIAN
    if mv.ndim != 1:
        raise TypeError(f"tokens: a token buffer must be 1-D (got {mv.ndim} dimensions)")
    if len(letter) != 1 or letter not in _INT_FORMATS or mv.itemsize not in (4, 8) or not native:
        raise buffer_format_error(fmt, mv.itemsize)
    signed = letter.islower()
    return ("i" if signed else "I") if mv.itemsize == 4 else ("q" if signed else "Q")


def _normalise(position: int, item: Any, limit: int, key_format: str) -> Token:
    if isinstance(item, bytes):
        if len(item) != DIGEST_SIZE:
            raise ValueError(f"token {position}: a digest token must be {DIGEST_SIZE} bytes (got {len(item)})")
        return item
    if isinstance(item, MmItemContext):
        return item.digest
    if isinstance(item, bool):
        raise TypeError(f"token {position}: bool is not a token id")
    try:
        value = as_int(f"token {position}", item)
    except TypeError:
        raise TypeError(
            f"token {position}: expected an int or a {DIGEST_SIZE}-byte digest, got {type(item).__name__}"
        ) from None
    if not 0 <= value < limit:
        raise token_out_of_range(position, value, key_format)
    return value


def token_list(tokens: Any, key_format: str = DEFAULT_KEY_FORMAT) -> list[Token]:
    """Validate ``tokens`` (a buffer of ints, or an iterable of ints / digests) into a list."""
    limit = TOKEN_ENCODING[key_format][1]
    try:
        mv = memoryview(tokens)
    except TypeError:
        mv = None
    if mv is not None:
        # Non-contiguous views are read through a C-order copy.
        items: Iterable[Any] = memoryview(mv.tobytes()).cast(buffer_int_code(mv))
    elif isinstance(tokens, (str, dict)) or not isinstance(tokens, Iterable):
        raise TypeError(f"tokens: expected a buffer or an iterable of tokens, got {type(tokens).__name__}")
    else:
        items = tokens
    return [_normalise(i, item, limit, key_format) for i, item in enumerate(items)]


# --- keys ----------------------------------------------------------------------------------


def reuse_scope_to_bytes(reuse_scope: ReuseScope | None) -> bytes:
    """One mask byte (bit 0: lora present, bit 1: salt present), then each present field u64 LE."""
    scope = check_reuse_scope(reuse_scope)
    mask = (scope.lora_id is not None) | (scope.salt is not None) << 1
    out = bytes([mask])
    for value in (scope.lora_id, scope.salt):
        if value is not None:
            out += value.to_bytes(8, "little")
    return out


def encode_block(block: list[Token], key_format: str) -> bytes:
    width = TOKEN_ENCODING[key_format][0]
    return b"".join(t if isinstance(t, bytes) else t.to_bytes(width, "little") for t in block)


def _keys(
    tokens_per_block: int, root: bytes, tokens: list[Token], key_format: str
) -> Iterator[tuple[list[Token], bytes]]:
    key = root
    yield [], key
    for start in range(0, len(tokens), tokens_per_block):
        block = tokens[start : start + tokens_per_block]
        key = hashlib.sha256(key + encode_block(block, key_format)).digest()
        yield block, key


def sequence_to_blockchain_keys(
    tokens_per_block: int,
    reuse_scope: ReuseScope | None,
    tokens: Any,
    key_format: str = DEFAULT_KEY_FORMAT,
) -> Iterator[tuple[list[Token], bytes]]:
    """Yield ``([], root_key)``, then ``(block_tokens, block_key)`` for each block, lazily.

    Arguments and every token are validated when called (not when iterated), so a bad token
    raises here whichever backend computes the keys.
    """
    tpb = int_in_range("tokens_per_block", tokens_per_block, 1)
    root = hashlib.sha256(reuse_scope_to_bytes(reuse_scope)).digest()
    fmt = check_key_format(key_format)
    return _keys(tpb, root, token_list(tokens, fmt), fmt)


def block_keys(
    tokens_per_block: int,
    reuse_scope: ReuseScope | None,
    tokens: Any,
    key_format: str = DEFAULT_KEY_FORMAT,
) -> bytes:
    """The same keys as ``sequence_to_blockchain_keys``, root first, concatenated (32 B each)."""
    return b"".join(key for _, key in sequence_to_blockchain_keys(tokens_per_block, reuse_scope, tokens, key_format))


# --- many chains at once (docs/key-format.md, "Many chains") ------------------------------

_T = TypeVar("_T")


def named_item(where: str, index: int, check: Callable[[Any], _T], value: Any) -> _T:
    """``check(value)`` for item ``index`` of the list argument ``where``: a plain ``TypeError``
    or ``ValueError`` it raises is raised again, same class, its message prefixed with
    ``where[index]: `` so that the bad input is named; anything else passes through as is."""
    try:
        return check(value)
    except (TypeError, ValueError) as e:
        if type(e) is not TypeError and type(e) is not ValueError:
            raise
        raise type(e)(f"{where}[{index}]: {e}") from e


def check_many_scopes(reuse_scopes: Any) -> list[ReuseScope] | None:
    """``reuse_scopes``: None (``ReuseScope()`` for every input) or a list or tuple whose items
    are checked one by one as ``reuse_scope`` is (errors name the item)."""
    if reuse_scopes is None:
        return None
    if not isinstance(reuse_scopes, (list, tuple)):
        raise TypeError(
            f"reuse_scopes: expected a list or tuple of ReuseScope or None, got {type(reuse_scopes).__name__}"
        )
    return [named_item("reuse_scopes", i, check_reuse_scope, s) for i, s in enumerate(reuse_scopes)]


def check_many_inputs(token_inputs: Any, scopes: list[ReuseScope] | None) -> list[Any]:
    """``token_inputs``: a list or tuple, one item per scope when ``reuse_scopes`` is a list. Its
    items are read (and named in errors) by the caller."""
    if not isinstance(token_inputs, (list, tuple)):
        raise TypeError(f"token_inputs: expected a list or tuple of token inputs, got {type(token_inputs).__name__}")
    inputs = list(token_inputs)
    if scopes is not None and len(scopes) != len(inputs):
        raise ValueError(f"token_inputs: {len(inputs)} inputs for {len(scopes)} reuse scopes")
    return inputs


def block_keys_many(
    tokens_per_block: int,
    reuse_scopes: Any,
    token_inputs: Any,
    key_format: str = DEFAULT_KEY_FORMAT,
) -> list[bytes]:
    """``block_keys`` of every input, in order. Checked, all before any hashing: tokens_per_block,
    reuse_scopes (the list, then each item), key_format, token_inputs (the list, its length, then
    each input's tokens); an item's error names it (``reuse_scopes[i]: ``, ``token_inputs[i]: ``)."""
    tpb = int_in_range("tokens_per_block", tokens_per_block, 1)
    scopes = check_many_scopes(reuse_scopes)
    fmt = check_key_format(key_format)
    inputs = check_many_inputs(token_inputs, scopes)
    lists = [named_item("token_inputs", i, lambda t: token_list(t, fmt), t) for i, t in enumerate(inputs)]
    return [block_keys(tpb, None if scopes is None else scopes[i], tokens, fmt) for i, tokens in enumerate(lists)]


def check_mm_item(id_offset: Any, digest: Any, num_tokens: Any, token_offset: Any) -> tuple[int, int, int]:
    """``gen_multimodal_cache_key_tokens``' ints, in order: ``id_offset`` a u64 token id,
    ``num_tokens`` in [1, TOKEN_LIMIT) and ``token_offset`` in [0, TOKEN_LIMIT) (positions in one
    item, as token counts), so that an absurd count is refused at once rather than built."""
    offset = int_in_range("id_offset", id_offset, 0, U64_LIMIT)
    check_digest("digest", digest)
    n = int_in_range("num_tokens", num_tokens, 1, TOKEN_LIMIT)
    start = int_in_range("token_offset", token_offset, 0, TOKEN_LIMIT)
    return offset, n, start


def gen_multimodal_cache_key_tokens(
    id_offset: int,
    digest: bytes,
    num_tokens: int,
    token_offset: int = 0,
    uuid: str | None = None,
) -> list[Token | MmItemContext]:
    """Tokens of one multimodal item: item-local token 0 is the digest, token j is id_offset + j.

    With a ``uuid`` the digest token is an ``MmItemContext`` carrying it (it is never hashed).
    Arguments are checked left to right before any work (``check_mm_item``).
    """
    offset, n, start = check_mm_item(id_offset, digest, num_tokens, token_offset)
    # Built whether or not token_offset leaves the digest out, so a bad uuid always fails.
    first: Token | MmItemContext = digest if uuid is None else MmItemContext(digest, uuid)
    return [first if start + i == 0 else offset + start + i for i in range(n)]


def cache_salt_to_id(cache_salt: str) -> int:
    """A tenant's salt string as the u64 salt of a ``ReuseScope`` (first 8 digest bytes, LE)."""
    return int.from_bytes(hashlib.sha256(as_str("cache_salt", cache_salt).encode("utf-8")).digest()[:8], "little")


# --- event hash forms ----------------------------------------------------------------------


def block_hash_v2_sha256(key: bytes) -> str:
    """``v2_sha256``: the key as 64 lowercase hex characters."""
    return check_digest("key", key).hex()


def block_hash_v2_sha256_64(key: bytes) -> int:
    """``v2_sha256_64``: the first 8 key bytes read big-endian (unlike the salt id)."""
    return int.from_bytes(check_digest("key", key)[:8], "big")


def v1_token_ids(tokens: Any) -> list[int]:
    """``block_hash_v1``'s tokens checked as u64 ids; a digest token has no v1 form (ValueError).
    Read as every key function reads tokens (a buffer or an iterable, not a str), as they come."""
    block = token_list(tokens, SHA256_U64)
    for position, token in enumerate(block):
        if isinstance(token, bytes):
            raise ValueError(f"token {position}: a digest token has no v1_block_key form")
    return cast(list[int], block)


_M64 = (1 << 64) - 1
_M32 = (1 << 32) - 1


def _mix32(value: int, seed: int) -> int:
    v = value & _M32
    v = (((v >> 16) ^ v) * 0x45D9F3B) & _M32
    v = (((v >> 16) ^ v) * 0x45D9F3B) & _M32
    v = (((v >> 16) ^ v) + 0x9E3779B9) & _M32
    return (seed ^ (v + (seed << 6) + (seed >> 2))) & _M64


def _mix64(value: int, seed: int) -> int:
    v = value & _M64
    v = ((v ^ (v >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    v = ((v ^ (v >> 27)) * 0x94D049BB133111EB) & _M64
    v ^= v >> 31
    return (seed ^ (v + 0x9E3779B9 + (seed << 6) + (seed >> 2))) & _M64


def block_hash_v1(tokens: Any, parent_hash: int, reuse_scope: ReuseScope | None = None) -> int:
    """``v1_block_key``: the legacy 64-bit mix of a block of int tokens under ``parent_hash``.

    ``parent_hash`` is 0 for a block under the root; the salt enters only there, the LoRA id
    enters every block. Blocks with digest tokens have no v1 form (events fall back to
    ``v2_sha256_64`` for them and their descendants).
    """
    scope = check_reuse_scope(reuse_scope)
    parent = int_in_range("parent_hash", parent_hash, 0, 1 << 64)
    block = v1_token_ids(tokens)
    seed = (len(block) ^ (parent * 0xBF58476D1CE4E5B9)) & _M64
    if parent == 0 and scope.salt is not None:
        seed = _mix64(scope.salt, seed)
    for token in block:
        seed = _mix32(token, seed)
    if scope.lora_id is not None:
        seed = _mix64(scope.lora_id, seed)
    return seed
