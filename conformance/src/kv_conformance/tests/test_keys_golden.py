"""Golden vectors (behaviour-spec §4, docs/key-format.md) on every backend and SHA-256 transform."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import pytest

import kv_api
from kv_api import ReuseScope

ROOT_EMPTY = "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d"
ROOT_7_11 = "9e22dbfea623bd030eb7ae4a0d71a7a6beb3cbf25797bcc31ddd0acc5513d3a3"
FULL_0_3 = "7b894451a88bc03088bd0c44f01139922b089a1ab691d157c273185c78ca83b2"
PARTIAL_4_5 = "5d66d4fdf7d16368dac24c64a9fb15e1e0d36dd5c702976f1db79a211bcfae2f"

# FIPS 180-4 / NIST known answers.
KAT = [
    (b"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
    (b"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
    (
        b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1",
    ),
    (
        b"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrs"
        b"mnopqrstnopqrstu",
        "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1",
    ),
    (b"a" * 1_000_000, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"),
]


def transforms(backend: kv_api.Backend) -> Iterator[str | None]:
    """Each SHA-256 transform the backend can force (restored afterwards), or just its default."""
    names = backend.capabilities.sha256_transforms
    if not names:
        yield None
        return
    active = backend.sha256_transform()  # type: ignore[attr-defined]
    try:
        for name in names:
            backend.select_sha256_transform(name)  # type: ignore[attr-defined]
            yield name
    finally:
        backend.select_sha256_transform(active)  # type: ignore[attr-defined]


def test_golden_vectors(backend: kv_api.Backend) -> None:
    for transform in transforms(backend):
        keys = backend.block_keys(4, None, list(range(6)))
        assert [keys[i : i + 32].hex() for i in range(0, len(keys), 32)] == [ROOT_EMPTY, FULL_0_3, PARTIAL_4_5], (
            transform
        )
        root = backend.block_keys(4, ReuseScope(7, 11), [])
        assert root.hex() == ROOT_7_11, transform
        assert backend.reuse_scope_to_bytes(ReuseScope(7, 11)) == b"\x03" + (7).to_bytes(8, "little") + (11).to_bytes(
            8, "little"
        )
        pairs = list(backend.sequence_to_blockchain_keys(4, None, range(6)))
        assert pairs == [
            ([], bytes.fromhex(ROOT_EMPTY)),
            ([0, 1, 2, 3], bytes.fromhex(FULL_0_3)),
            ([4, 5], bytes.fromhex(PARTIAL_4_5)),
        ]


def test_scope_none_is_not_zero(backend: kv_api.Backend) -> None:
    scopes = [
        ReuseScope(),
        ReuseScope(0, None),
        ReuseScope(None, 0),
        ReuseScope(0, 0),
        ReuseScope(1, None),
        ReuseScope(None, 1),
    ]
    roots = {backend.block_keys(4, s, []) for s in scopes}
    assert len(roots) == len(scopes)
    assert backend.reuse_scope_to_bytes(ReuseScope(None, 0)) == b"\x02" + bytes(8)


def test_u64_format_encodes_eight_bytes(backend: kv_api.Backend) -> None:
    root = hashlib.sha256(b"\x00").digest()
    expected = hashlib.sha256(root + b"".join(t.to_bytes(8, "little") for t in (1, 2**40, 2**64 - 1))).digest()
    assert backend.block_keys(3, None, [1, 2**40, 2**64 - 1], "sha256-u64")[32:] == expected


def test_event_hash_forms(backend: kv_api.Backend) -> None:
    key = bytes.fromhex(FULL_0_3)
    assert backend.block_hash_v2_sha256(key) == FULL_0_3
    assert backend.block_hash_v2_sha256_64(key) == int(FULL_0_3[:16], 16)
    parent = backend.block_hash_v1([1, 2, 3, 4], 0)
    assert parent == 924206229973855
    assert backend.block_hash_v1([5, 6], parent) == 6875034662206558884
    salted = backend.block_hash_v1([1, 2, 3, 4], 0, ReuseScope(salt=123))
    assert salted == 6280297290684427985
    assert backend.block_hash_v1([5, 6], salted, ReuseScope(salt=123)) == 18177682803760873588


def test_cache_salt_to_id(backend: kv_api.Backend) -> None:
    for salt in ("", "tenant-a", "ünïcødé"):
        assert backend.cache_salt_to_id(salt) == int.from_bytes(hashlib.sha256(salt.encode()).digest()[:8], "little")


def test_multimodal_tokens(backend: kv_api.Backend) -> None:
    digest = bytes(range(32))
    assert backend.gen_multimodal_cache_key_tokens(1000, digest, 3) == [digest, 1001, 1002]
    assert backend.gen_multimodal_cache_key_tokens(1000, digest, 2, 5) == [1005, 1006]
    with_uuid = backend.gen_multimodal_cache_key_tokens(1000, digest, 2, 0, "img-1")
    item = with_uuid[0]
    assert isinstance(item, kv_api.MmItemContext) and item == kv_api.MmItemContext(digest, "img-1")
    assert item.uuid == "img-1"
    # The uuid never enters the key.
    assert backend.block_keys(2, None, with_uuid) == backend.block_keys(2, None, [digest, 1001])


@pytest.mark.requires("sha256_transforms")
@pytest.mark.parametrize(("message", "digest"), KAT, ids=["empty", "abc", "448-bit", "896-bit", "million-a"])
def test_known_answers_through_every_transform(backend: kv_api.Backend, message: bytes, digest: str) -> None:
    for transform in transforms(backend):
        assert backend.sha256(message).hex() == digest, transform  # type: ignore[attr-defined]


@pytest.mark.requires("sha256_transforms")
def test_transforms_agree_on_every_length(backend: kv_api.Backend) -> None:
    data = bytes((i * 131 + 7) & 0xFF for i in range(1100))
    for transform in transforms(backend):
        for n in range(0, 1100, 7):
            assert backend.sha256(data[:n]) == hashlib.sha256(data[:n]).digest(), (transform, n)  # type: ignore[attr-defined]


@pytest.mark.requires("sha256_transforms")
def test_forcing_an_unknown_transform_is_a_clear_error(backend: kv_api.Backend) -> None:
    with pytest.raises(ValueError, match="available: portable"):
        backend.select_sha256_transform("sha3")  # type: ignore[attr-defined]
