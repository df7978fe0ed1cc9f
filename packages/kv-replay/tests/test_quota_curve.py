"""``--quota-curve``: the stack distances of one unbounded replay give the hit rate a replay at
each quota gets: by hand, exactly where the schedule cannot differ (hypothesis), and within a
point of a real sweep on the Mooncake trace."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kv_api
from kv_replay.cli import main
from kv_replay.model import model_config
from kv_replay.quota_curve import CURVE_SCHEMA, QuotaCurve, curve_quotas
from kv_replay.replayer import Replayer
from kv_replay.stack_recorder import StackRecorder
from kv_replay.trace import Request, synthetic_tokens

GRANULE = 2 << 20  # the device granularity: a granule split into ``slots`` slots
TPB = 4
NOTHING = np.zeros(0, dtype=np.int32)


def replay_at(backend: kv_api.Backend, requests: list[Request], slots: int, in_flight: int) -> int:
    """Tokens reused at first starts by a replay with ``slots`` device slots (whole blocks only)."""
    config = model_config("1", TPB, GRANULE, GRANULE // (2 * TPB * slots), partial_reuse=False)
    result = Replayer(backend, config, in_flight).run(requests)
    assert not any(r.preemptions or r.rejected for r in result.records)
    return sum(r.reused_tokens for r in result.records)


def recorded(
    backend: kv_api.Backend, requests: list[Request], in_flight: int, rate: float = 1.0
) -> tuple[StackRecorder, QuotaCurve]:
    """The recorder and curve of one replay with room for every block (``partial_reuse`` off, as
    ``replay_at``)."""
    slots = sum(len(r.prompt) + len(r.output) for r in requests) // TPB + len(requests) + 1
    config = model_config("1", TPB, GRANULE * slots, GRANULE // (2 * TPB), partial_reuse=False)
    replayer = Replayer(backend, config, in_flight)
    replayer.recorder = recorder = StackRecorder(TPB, rate)
    result = replayer.run(requests)
    assert sum(r.reused_tokens for r in result.records) == recorder.reused_full_tokens
    return recorder, QuotaCurve.of(recorder, sum(r.prompt_tokens for r in result.records))


def test_distances_by_hand(backend: kv_api.Backend) -> None:
    """A (blocks a1 a2), B (b1 b2), then A's prompt and one more block: each close queues its
    blocks last first (a2, a1, b2, b1), so a1 needs 3 slots (b2, b1 and itself) and a2 4."""
    a, b = synthetic_tokens(1, 2 * TPB), synthetic_tokens(2, 2 * TPB)
    requests = [
        Request(a, NOTHING),
        Request(b, NOTHING),
        Request(np.concatenate([a, synthetic_tokens(3, TPB)]), NOTHING),
    ]
    recorder, curve = recorded(backend, requests, 1)
    assert recorder.distances == [3, 4]  # in the prompt's order
    assert [curve.reused_tokens(s) for s in (2, 3, 4)] == [0, TPB, 2 * TPB]
    assert [replay_at(backend, requests, s, 1) for s in (3, 4)] == [TPB, 2 * TPB]  # C needs 3 slots


def test_decoded_blocks_count_and_blocks_in_use_are_always_cached(backend: kv_api.Backend) -> None:
    """A request's decoded blocks are queued with its prompt's at its close (o2, o1, b2, b1 after
    a2, a1): a1 needs 5 slots, not 3. A block a running request holds is in use: distance 0."""
    a, b = synthetic_tokens(1, 2 * TPB), synthetic_tokens(2, 2 * TPB)
    again = Request(np.concatenate([a, synthetic_tokens(3, TPB)]), NOTHING)
    requests = [Request(a, NOTHING), Request(b, synthetic_tokens(9, 2 * TPB)), again]
    recorder, _ = recorded(backend, requests, 1)
    assert recorder.distances == [5, 6]
    assert [replay_at(backend, requests, s, 1) for s in (5, 6)] == [TPB, 2 * TPB]
    running, _ = recorded(backend, [Request(a, synthetic_tokens(9, 3 * TPB)), again], 2)
    assert running.distances == [0, 0]


def test_blocks_in_use_stay_above_a_released_block(backend: kv_api.Backend) -> None:
    """While B runs (b1 b2 in use), A's blocks, released before, need B's too: 3 and 4 slots."""
    a, b = synthetic_tokens(1, 2 * TPB), synthetic_tokens(2, 2 * TPB)
    again = Request(np.concatenate([a, synthetic_tokens(3, TPB)]), NOTHING)
    recorder, _ = recorded(backend, [Request(a, NOTHING), Request(b, synthetic_tokens(9, 6 * TPB)), again], 2)
    assert recorder.distances == [3, 4]


documents = st.lists(st.integers(1, 3), min_size=4, max_size=4)  # blocks per document


@settings(max_examples=40, deadline=None)
@given(
    sizes=documents,
    prompts=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=3), min_size=1, max_size=12),
    in_flight=st.integers(1, 3),
    spare=st.integers(0, 12),
)
def test_the_curve_is_the_replay_where_the_schedule_is_the_same(
    backend: kv_api.Backend, sizes: list[int], prompts: list[list[int]], in_flight: int, spare: int
) -> None:
    """Prompts made of shared documents, whole blocks, nothing decoded: at any quota that holds
    every running prompt at once (so no request waits), the estimate is the replay's reuse."""
    docs = [synthetic_tokens(10 + i, n * TPB) for i, n in enumerate(sizes)]
    requests = [Request(np.concatenate([docs[d] for d in p]), NOTHING) for p in prompts]
    _, curve = recorded(backend, requests, in_flight)
    slots = in_flight * (max(len(r.prompt) for r in requests) // TPB + 1) + spare  # + a whole prompt's copy
    assert curve.reused_tokens(slots) == replay_at(backend, requests, slots, in_flight)


def test_sampling_keeps_a_share_and_the_unbounded_rate(backend: kv_api.Backend) -> None:
    docs = [synthetic_tokens(i, 64 * TPB) for i in range(8)]
    requests = [Request(np.concatenate([docs[i % 8], docs[(i * 3) % 8]]), NOTHING) for i in range(40)]
    _, every = recorded(backend, requests, 2)
    _, half = recorded(backend, requests, 2, rate=0.5)
    assert 0.3 < half.sampled_blocks / every.sampled_blocks < 0.7
    assert half.reused_tokens(10**9) == every.reused_tokens(10**9)  # the ratio estimate ends exact
    with pytest.raises(ValueError, match="rate"):
        StackRecorder(TPB, 0.0)


def test_quotas_are_powers_of_two_up_to_every_distance_and_the_asked_ones() -> None:
    recorder = StackRecorder(TPB)
    recorder.distances, recorder.reused_full_tokens = [5, 1000], 2 * TPB
    curve = QuotaCurve.of(recorder, 100)
    assert curve_quotas(curve, 1 << 20, [3 << 20]) == [2 << 20, 3 << 20, *(1 << k for k in range(22, 31))]
    assert curve.hit_rate(5) == pytest.approx(TPB / 100) and curve.hit_rate(1000) == pytest.approx(2 * TPB / 100)


def test_within_a_point_of_the_sweep_on_mooncake(capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's check, on the first 600 requests (the bench runs the whole trace)."""
    args = ["replay", "mooncake-synthetic", "--limit", "600", "--quota", "256M,1G,4G", "--json", "--quiet"]
    assert main([*args, "--quota-curve"]) == 0
    curve = json.loads(capsys.readouterr().out)
    jsonschema.validate(curve, CURVE_SCHEMA)
    estimated = {p["quota"]: p["hit_rate"] for p in curve["quota_curve"]}
    assert main(args) == 0
    sweep = json.loads(capsys.readouterr().out)
    replayed = {row["quota"]: row["hit_rate"] for row in sweep["rows"]}
    assert len(replayed) == 3 and max(replayed.values()) > 0.02
    for quota, rate in replayed.items():
        assert abs(estimated[quota] - rate) < 0.01, (quota, estimated[quota], rate)
    assert curve["unbounded"]["hit_rate"] == sweep["unbounded"][0]["hit_rate"]


def test_the_table_has_every_row_and_the_replayed_ceiling(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--quota-curve", "--quota", "3M", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "quotas: device, every quota (estimated); no host or disk tier" in out
    table, _, notes = out.partition("\n\n")[2].partition("\n\n")
    rows = {line.split()[0]: line for line in table.splitlines()[2:]}
    assert list(rows)[-1] == "unbounded" and rows["unbounded"].startswith("unbounded (replayed)")
    assert rows["3M"].endswith("% *") and rows["256M"].endswith("%  ")  # below the peak in use, or not
    assert notes.startswith("from one replay at an unbounded quota, every block: ")
    assert "* fewer slots than that replay held in use at its peak" in notes


@pytest.mark.parametrize(
    ("flags", "why"),
    [
        (["--compare"], "not with --compare"),
        (["--host-quota", "1G"], "not with --host-quota"),
        (["--disk-quota", "1G"], "not with --disk-quota"),
        (["--instances", "2"], "not with --instances"),
        (["--publish", "tcp://127.0.0.1:*"], "not with --publish"),
        (["--layers", "2,2x64"], "full-attention layers only"),
        (["--layers", "2,1ssm"], "full-attention layers only"),
    ],
)
def test_what_the_curve_cannot_estimate_is_refused(
    capsys: pytest.CaptureFixture[str], flags: list[str], why: str
) -> None:
    assert main(["replay", "--quota-curve", *flags]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"kvcore: error: --quota-curve: {why}"), err


def test_a_quota_that_cannot_be_mapped_fails_before_the_replay(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--quota-curve", "--quota", "1P"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("kvcore: error: --quota 1P: cannot map"), err


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="needs matplotlib")
def test_the_plot_is_drawn(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "curve.png"
    assert main(["replay", "--quota-curve", "--quiet", "--plot", str(path)]) == 0
    assert path.stat().st_size > 1000 and f"wrote the plot to {path}" in capsys.readouterr().err
