"""The fuzzer (docs/fuzzing.md) on a fixed budget: derandomized cases of every public member with
adversarial arguments, on every backend under test at once (backends that differ in the
capabilities the fuzzer uses: one run per set they declare). A finding fails the test unless
``kv_conformance.fuzz.known`` lists it; a listed divergence that no longer shows is reported
(a warning: its fix landed, remove the entry). ``nox -s fuzz`` runs longer."""

from __future__ import annotations

import warnings

import pytest

import kv_api
from kv_conformance import fuzz

#: Cases per shard; shards draw from different seeds and run on different xdist workers.
CASES = 1000
SHARDS = 2


@pytest.mark.parametrize("shard", range(SHARDS))
def test_fuzz_finds_nothing_unknown(backends: list[kv_api.Backend], shard: int) -> None:
    names = sorted((b.name for b in backends), key=lambda n: n != "py")  # the readable reference first
    # One run per set of capabilities the backends declare (one when they are alike), each
    # drawing only what its backends have; the known divergences' examples run once, in the
    # first shard's first run.
    for i, (group, caps) in enumerate(fuzz.plan(names)):
        cases = fuzz.generate(CASES, seed=shard, capabilities=caps)
        report = fuzz.run(group, cases, timeout=5.0, with_pinned=shard == 0 and i == 0, capabilities=caps)
        print(report.summary())
        for known in report.stale:
            warnings.warn(f"known fuzz divergence no longer occurs, remove it: {known.example}", stacklevel=1)
        assert not report.unknown, report.format()
