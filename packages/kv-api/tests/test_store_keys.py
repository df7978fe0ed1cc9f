"""StoreKeys: a list of store keys in every way a store reads one, each key built where read."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kv_api import StoreKeys


@given(
    namespace=st.binary(max_size=40),
    digests=st.lists(st.binary(min_size=32, max_size=32), max_size=12),
    index=st.integers(-15, 15),
    start=st.none() | st.integers(-15, 15),
    stop=st.none() | st.integers(-15, 15),
    step=st.none() | st.integers(-4, 4).filter(lambda s: s != 0),
)
def test_reads_as_the_list_of_keys(
    namespace: bytes, digests: list[bytes], index: int, start: int | None, stop: int | None, step: int | None
) -> None:
    keys = StoreKeys(namespace, b"".join(digests))
    expected = [namespace + d for d in digests]
    assert len(keys) == len(expected) and list(keys) == expected and keys == expected and keys == tuple(expected)
    assert keys[start:stop:step] == expected[start:stop:step]
    if -len(expected) <= index < len(expected):
        assert keys[index] == expected[index]
    else:
        with pytest.raises(IndexError):
            keys[index]
    assert keys != [*expected, b"x"]
    if expected:
        assert keys != [*expected[:-1], b"y"] and expected[0] in keys


def test_refuses_what_is_not_keys() -> None:
    with pytest.raises(ValueError, match="whole number of 32-byte keys"):
        StoreKeys(b"ns:", bytes(33))
    keys = StoreKeys(b"ns:", bytes(64))
    with pytest.raises(TypeError, match="integers or slices, not str"):
        keys["1"]  # type: ignore[call-overload]
    with pytest.raises(TypeError):
        hash(keys)
    assert repr(keys) == "StoreKeys(2 keys under b'ns:')"
