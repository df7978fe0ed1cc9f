"""``LifeCycle.get_stale_range``: the stale-range rule of docs/manager.md ("Vocabulary")."""

from __future__ import annotations

import pytest

from kv_api.descriptors import LifeCycle


@pytest.mark.parametrize("history", [0, 1, 4, 5, 100])
def test_full_attention_has_no_stale_blocks(history: int) -> None:
    begin, end = LifeCycle(0, None, 0, 4).get_stale_range(history)
    assert begin == end


@pytest.mark.parametrize(
    ("history", "expected"),
    [
        (0, (0, 0)),
        (7, (0, 0)),  # (7 + 1 - 8) // 4 = 0: the token in flight still sees block 0
        (8, (0, 0)),
        (11, (0, 1)),
        (12, (0, 1)),
        (13, (0, 1)),
        (15, (0, 2)),
    ],
)
def test_window(history: int, expected: tuple[int, int]) -> None:
    assert LifeCycle(0, 8, 0, 4).get_stale_range(history) == expected


@pytest.mark.parametrize(
    ("history", "expected"),
    [
        (0, (0, 0)),
        (3, (1, 1)),  # one block written: it is a sink, never stale
        (5, (2, 2)),
        (20, (2, 3)),
        (40, (2, 8)),
    ],
)
def test_window_with_sinks(history: int, expected: tuple[int, int]) -> None:
    assert LifeCycle(0, 8, 2, 4).get_stale_range(history) == expected


def test_tokens_per_block_argument() -> None:
    """The reference passes the block size; without it the life cycle's own is used."""
    life_cycle = LifeCycle(0, 8, 1, 4)
    assert life_cycle.get_stale_range(40, 4) == life_cycle.get_stale_range(40) == (1, 8)
    assert life_cycle.get_stale_range(40, 8) == (1, 4)
