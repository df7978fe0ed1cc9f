"""What differs between the three kinds of life cycle (full attention, a sliding window, SSM
state), behind one small interface: the code asks a layer group's kind instead of branching on
``window`` and ``ssm`` wherever the kinds part ways (the shape of vLLM v1's per-type managers)."""

from __future__ import annotations

from abc import ABC, abstractmethod

from kv_api.descriptors import LifeCycle


class LifeCycleKind(ABC):
    """One life cycle's kind. ``has_block_pages``: a page per block (attention), or one state
    per request (SSM); ``has_scratch``: sliding-window scratch may apply; ``goes_stale``: some
    block can go stale (full attention needs every block; the native backend's shortcut for
    caches of full attention only asks it)."""

    has_block_pages = True
    has_scratch = False
    goes_stale = True

    def __init__(self, life_cycle: LifeCycle) -> None:
        self.life_cycle = life_cycle

    def stale_range(self, history: int) -> tuple[int, int]:
        """Blocks ``[begin, end)`` not needed for the next step at ``history`` tokens: the rule
        priority callbacks see (``LifeCycle.get_stale_range``)."""
        return self.life_cycle.get_stale_range(history)

    @abstractmethod
    def slots_floor(self, window_floors: list[int]) -> int:
        """Slots one request may need at once; ``window_floors``: the window kinds' own."""

    @abstractmethod
    def drop_takes_subtree(self, ordinal: int) -> bool:
        """Whether losing block ``ordinal``'s page makes every later block unusable."""

    @abstractmethod
    def planned_drop_first(self, num_tokens: int, num_blocks: int) -> int | None:
        """The first of a request's ``num_blocks`` matched blocks whose page a planned drop
        covers once ``num_tokens`` are committed; None: none is."""

    def peak_history(self, last: int) -> int | None:
        """A history below ``last`` where a request growing one token per step may need more
        slots than at ``last``; None: the need never falls."""
        return None


class FullAttention(LifeCycleKind):
    goes_stale = False

    def slots_floor(self, window_floors: list[int]) -> int:
        # Shares a pool group with windows, whose straddling block it must leave room for.
        return max(window_floors, default=1)

    def drop_takes_subtree(self, ordinal: int) -> bool:
        return True

    def planned_drop_first(self, num_tokens: int, num_blocks: int) -> int | None:
        return None  # later turns reuse every block


class SlidingWindow(LifeCycleKind):
    has_scratch = True

    @property
    def window_floor(self) -> int:
        """A window straddles one extra block while it slides."""
        tokens_per_block = self.life_cycle.tokens_per_block
        window = self.life_cycle.window
        assert window is not None
        return self.life_cycle.num_sink_blocks + (window + tokens_per_block - 2) // tokens_per_block + 1

    def slots_floor(self, window_floors: list[int]) -> int:
        return self.window_floor

    def drop_takes_subtree(self, ordinal: int) -> bool:
        return ordinal < self.life_cycle.num_sink_blocks  # a sink page is needed by every later step

    def planned_drop_first(self, num_tokens: int, num_blocks: int) -> int | None:
        # From the end of the stale range (never a sink block: the range starts after them).
        return min(self.stale_range(num_tokens)[1], num_blocks)

    def peak_history(self, last: int) -> int | None:
        # The need is periodic once blocks turn stale, highest just before the stale range
        # grows: ``(h + 2 - W) % tokens_per_block == 0``.
        window = self.life_cycle.window
        assert window is not None
        h = last - (last + 2 - window) % self.life_cycle.tokens_per_block
        return h if h >= 0 else None


class StateSpace(LifeCycleKind):
    has_block_pages = False

    def slots_floor(self, window_floors: list[int]) -> int:
        return 1  # the request's state

    def drop_takes_subtree(self, ordinal: int) -> bool:
        return False  # a snapshot serves only a request ending on its block

    def planned_drop_first(self, num_tokens: int, num_blocks: int) -> int | None:
        return num_blocks - 1  # the last block's snapshot


def kind_of(life_cycle: LifeCycle) -> LifeCycleKind:
    if life_cycle.ssm:
        return StateSpace(life_cycle)
    if life_cycle.window is None:
        return FullAttention(life_cycle)
    return SlidingWindow(life_cycle)
