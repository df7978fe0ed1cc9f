"""Capability gates for the replayer tests the plugin's ``requires`` marker cannot gate: tests
that take every backend under test at once (``backends``), tests whose need depends on a drawn
example (SSM layers), and tests that run ``--compare``, which replays on every installed backend,
not just those under test (``compare_on_capable`` narrows it to those that have what the test
needs). A backend lacking a capability is left out, or the test is skipped naming it, so that a
backend declaring fewer capabilities passes."""

from __future__ import annotations

import pytest

import kv_api


def layer_needs(layers: str) -> tuple[str, ...]:
    """The capabilities a ``--layers`` spec needs."""
    return ("ssm_layers",) if "ssm" in layers else ()


def having(backends: list[kv_api.Backend], *capabilities: str) -> list[kv_api.Backend]:
    """The backends that declare every one of ``capabilities``."""
    return [b for b in backends if all(getattr(b.capabilities, c) for c in capabilities)]


def compare_on_capable(monkeypatch: pytest.MonkeyPatch, *capabilities: str) -> list[str]:
    """``--compare`` replays on every installed backend; here on those that declare
    ``capabilities`` (a pair that does not share them is not compared): their names. Skip if
    none does."""
    names = [n for n in kv_api.available_backends() if having([kv_api.load_backend(n)], *capabilities)]
    if not names:
        pytest.skip(f"no installed backend has {', '.join(capabilities)}")
    monkeypatch.setattr(kv_api, "available_backends", lambda: list(names))
    return names


def skip_unless(backend: kv_api.Backend, *capabilities: str) -> None:
    """Skip, as the ``requires`` marker does, where the need depends on a parameter."""
    missing = [c for c in capabilities if not getattr(backend.capabilities, c)]
    if missing:
        pytest.skip(f"backend {backend.name!r} lacks capability {', '.join(map(repr, missing))}")


def skip_unless_any(backends: list[kv_api.Backend], *capabilities: str) -> list[kv_api.Backend]:
    """The backends under test that have ``capabilities``; skip if none has."""
    found = having(backends, *capabilities)
    if not found:
        pytest.skip(f"no backend under test has {', '.join(capabilities)}")
    return found
