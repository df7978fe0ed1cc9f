"""Converting arguments before they are looked up or read (docs/errors.md, "Arguments"): a str
that is no UTF-8 is an unknown name, None is no token list for ``commit``, an exception a token
iterable's ``__iter__`` raises propagates as is, and ``gen_multimodal_cache_key_tokens`` checks
its ranges and its uuid left to right before any work. Each outcome is the same class and
message on every backend, with nothing changed (were known fuzzer divergences 6-9)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest

import kv_api
from kv_api.constants import TOKEN_LIMIT

from ._manager import active, fails_atomically, make_manager, toks

NOT_UTF8 = "\ud800"  # a lone surrogate: a str, but not one UTF-8 can encode


def outcome(call: Callable[[], object]) -> tuple[type[BaseException], str] | tuple[str, object]:
    try:
        return ("returned", call())
    except Exception as exc:  # noqa: BLE001 - the class and message are what we compare
        return type(exc), str(exc)


def same_everywhere(backends: list[kv_api.Backend], call: Callable[[kv_api.Backend], object]) -> Any:
    """``call``'s outcome on every backend, asserted identical; returns it."""
    seen = [outcome(partial(call, b)) for b in backends]
    assert all(s == seen[0] for s in seen), list(zip([b.name for b in backends], seen, strict=True))
    return seen[0]


# -- names that are no UTF-8 ------------------------------------------------------------------

NO_BUFFER = "\"no buffer '\\\\ud800' in layer 0\""  # str() of the KeyError: the repr of its message
LOOKUPS: dict[str, Callable[[kv_api.KVCacheManager], object]] = {
    "get_page_stride": lambda m: m.get_page_stride(0, NOT_UTF8),
    "get_page_index_upper_bound": lambda m: m.get_page_index_upper_bound(0, NOT_UTF8),
    "get_page_index_converter": lambda m: m.get_page_index_converter(0, NOT_UTF8),
}


@pytest.mark.parametrize("lookup", LOOKUPS.values(), ids=LOOKUPS.keys())
def test_a_role_that_is_no_utf8_is_an_unknown_role(
    backends: list[kv_api.Backend], lookup: Callable[[kv_api.KVCacheManager], object]
) -> None:
    for backend in backends:
        manager = make_manager(backend)
        cache = active(manager, 8, toks(5))
        fails_atomically(manager, [cache], partial(lookup, manager), KeyError)
    assert same_everywhere(backends, lambda b: lookup(make_manager(b))) == (KeyError, NO_BUFFER)


def test_a_key_format_that_is_no_utf8_is_unknown(backends: list[kv_api.Backend]) -> None:
    message = "key_format: unknown '\\ud800' (expected one of sha256-u32, sha256-u64)"
    assert same_everywhere(backends, lambda b: b.block_keys(4, None, [1], NOT_UTF8)) == (ValueError, message)
    assert same_everywhere(backends, lambda b: b.sequence_to_blockchain_keys(4, None, [1], NOT_UTF8)) == (
        ValueError,
        message,
    )


def test_a_hash_algo_that_is_no_utf8_is_unsupported(backends: list[kv_api.Backend]) -> None:
    result = same_everywhere(backends, lambda b: b.KVCacheEventManager(4, NOT_UTF8))
    assert result[0] is ValueError and "'\\ud800'" in result[1]


def test_a_salt_that_is_no_utf8_fails_to_encode_alike(backends: list[kv_api.Backend]) -> None:
    """A salt is encoded, not looked up: UTF-8's own error, on every backend."""
    assert same_everywhere(backends, lambda b: b.cache_salt_to_id(NOT_UTF8))[0] is UnicodeEncodeError


# -- commit's tokens ----------------------------------------------------------------------------


class Boom(Exception):
    pass


class RaisesIter:
    def __iter__(self) -> Iterator[int]:
        raise Boom("__iter__")


class OnlyGetitem:
    """A sequence by the old protocol but no ``Iterable``: token lists are iterables."""

    def __getitem__(self, i: int) -> int:
        if i < 3:
            return i
        raise IndexError(i)


@pytest.mark.parametrize(
    ("tokens", "error", "message"),
    [
        (None, TypeError, "tokens: expected a buffer or an iterable of tokens, got NoneType"),
        (OnlyGetitem(), TypeError, "tokens: expected a buffer or an iterable of tokens, got OnlyGetitem"),
        (RaisesIter(), Boom, "__iter__"),
    ],
    ids=["None", "getitem-only", "raising __iter__"],
)
def test_commit_refuses_what_is_no_token_iterable(
    backends: list[kv_api.Backend], tokens: Any, error: type[BaseException], message: str
) -> None:
    """None is no token list (the contract types it), and an ``__iter__`` that raises
    propagates its own exception, as a Python for loop would."""
    for backend in backends:
        manager = make_manager(backend)
        cache = active(manager, 8, toks(5))
        fails_atomically(manager, [cache], partial(cache.commit, tokens), error, probes=[(None, toks(8))])
    assert same_everywhere(backends, lambda b: active(make_manager(b), 8, toks(5)).commit(tokens)) == (error, message)


# -- gen_multimodal_cache_key_tokens ---------------------------------------------------------

DIGEST = bytes(range(32))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((2**64, DIGEST, 2), "id_offset: must be in [0, 18446744073709551616) (got 18446744073709551616)"),
        ((0, DIGEST, 2**64), f"num_tokens: must be in [1, {TOKEN_LIMIT}) (got 18446744073709551616)"),
        ((0, DIGEST, TOKEN_LIMIT), f"num_tokens: must be in [1, {TOKEN_LIMIT}) (got {TOKEN_LIMIT})"),
        ((0, DIGEST, 0), f"num_tokens: must be in [1, {TOKEN_LIMIT}) (got 0)"),
        ((0, DIGEST, 2, TOKEN_LIMIT), f"token_offset: must be in [0, {TOKEN_LIMIT}) (got {TOKEN_LIMIT})"),
        ((0, DIGEST, 2**70, 2**70), f"num_tokens: must be in [1, {TOKEN_LIMIT}) (got {2**70})"),  # left to right
    ],
    ids=["id_offset 2**64", "num_tokens 2**64", "num_tokens at limit", "num_tokens 0", "offset at limit", "order"],
)
def test_multimodal_ranges_are_checked_before_any_work(
    backends: list[kv_api.Backend], args: tuple[Any, ...], message: str
) -> None:
    """An absurd count is refused at once (the native backend used to loop on 2**64)."""
    start = time.perf_counter()
    assert same_everywhere(backends, lambda b: b.gen_multimodal_cache_key_tokens(*args)) == (ValueError, message)
    assert time.perf_counter() - start < 1.0


def test_multimodal_values_at_the_edges_agree(backends: list[kv_api.Backend]) -> None:
    result = same_everywhere(
        backends, lambda b: b.gen_multimodal_cache_key_tokens(2**64 - 1, DIGEST, 2, TOKEN_LIMIT - 1)
    )
    assert result == ("returned", [2**64 - 1 + TOKEN_LIMIT - 1, 2**64 - 1 + TOKEN_LIMIT])


@pytest.mark.parametrize("token_offset", [0, 1], ids=["digest in", "digest out"])
def test_multimodal_uuid_is_checked_whether_or_not_the_digest_is_used(
    backends: list[kv_api.Backend], token_offset: int
) -> None:
    result = same_everywhere(backends, lambda b: b.gen_multimodal_cache_key_tokens(0, DIGEST, 2, token_offset, 5))  # type: ignore[arg-type]
    assert result == (TypeError, "MmItemContext.uuid: expected str or None, got int")
