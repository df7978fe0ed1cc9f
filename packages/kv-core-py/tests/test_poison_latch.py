"""The Python backend's poison latch internals (docs/errors.md, "The poison latch"): the error an
internal check raises is the one it records, and the debug hook checks its argument's type."""

from __future__ import annotations

import pytest

from kv_api.errors import CorruptedError
from kv_core_py import poison


@pytest.fixture
def clean_latch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start unpoisoned; monkeypatch puts the latch back as it was after the test."""
    monkeypatch.setattr(poison, "_reason", None)


def test_corrupted_records_its_reason_and_reports_it(clean_latch: None) -> None:
    error = poison.corrupted("a broken invariant")
    assert isinstance(error, CorruptedError)
    assert str(error) == "a broken invariant"
    assert poison.reason() == "a broken invariant"
    with pytest.raises(CorruptedError, match=r"^kvcore is poisoned: a broken invariant$"):
        poison.check()


def test_debug_poison_names_the_wrong_type(clean_latch: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(poison.DEBUG_HOOKS_ENV, "1")
    with pytest.raises(TypeError, match=r"^reason: expected a str, got int$"):
        poison.debug_poison(3)  # type: ignore[arg-type]
    assert poison.reason() is None
