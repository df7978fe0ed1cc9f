"""The replay always ends: every request completes or is rejected, within a step bound that the
workload sets, identically on every backend."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st
from replay_gates import compare_on_capable, having, layer_needs

import kv_api
from kv_replay.cli import main
from kv_replay.cluster import CLUSTER_SCHEMA
from kv_replay.model import model_config
from kv_replay.replay_result import ReplayResult
from kv_replay.replayer import Replayer
from kv_replay.report import COMPARE_SCHEMA, SUMMARY_SCHEMA, SWEEP_SCHEMA
from kv_replay.trace import Request, synthetic_tokens

GRANULE = 2 << 20  # the device granularity: quotas below it round up to it


def replay(
    backend: kv_api.Backend, requests: list[Request], tpb: int, slots: int, in_flight: int, layers: str = "1"
) -> ReplayResult:
    """``slots`` blocks of device memory per layer (one 2 MiB granule split into that many)."""
    per_layer = len(layers.split(","))
    config = model_config(layers, tpb, GRANULE * per_layer, GRANULE // (2 * tpb * slots), partial_reuse=True)
    return Replayer(backend, config, in_flight).run(requests)


def check_terminated(result: ReplayResult, requests: list[Request]) -> None:
    completed = sum(not r.rejected for r in result.records)
    rejected = sum(r.rejected for r in result.records)
    assert completed + rejected == len(requests)
    assert result.steps <= len(requests) + sum(len(r.output) for r in requests)
    # The per-step samples end where the summary does: every prompt counted, rejected ones missed.
    last = result.samples[-1]
    assert (last.completed, last.prompt_tokens) == (len(requests), sum(len(r.prompt) for r in requests))
    assert last.reused_tokens == sum(r.reused_tokens for r in result.records)


def test_a_request_larger_than_the_pool_is_rejected_and_the_rest_complete(backend: kv_api.Backend) -> None:
    # The regression: one request far larger than the pool, then small ones behind it. The replay
    # used to re-queue the small ones behind the large one forever.
    big = Request(synthetic_tokens(0, 20_000), synthetic_tokens(1, 4))
    small = [Request(synthetic_tokens(2 + i, 40), synthetic_tokens(10 + i, 4)) for i in range(3)]
    config = model_config("4", 32, 1 << 20, 256)
    result = Replayer(backend, config, 16).run([big, *small])
    assert [r.rejected for r in result.records] == [True, False, False, False]
    check_terminated(result, [big, *small])


def test_a_request_whose_output_outgrows_the_pool_is_rejected(backend: kv_api.Backend) -> None:
    # It starts (its prompt fits) but decoding alone runs out of pages: preempting itself would
    # restart it forever.
    requests = [
        Request(synthetic_tokens(0, 24), synthetic_tokens(1, 60)),
        Request(synthetic_tokens(2, 8), synthetic_tokens(3, 2)),
    ]
    result = replay(backend, requests, tpb=4, slots=16, in_flight=4)
    assert [r.rejected for r in result.records] == [True, False]
    check_terminated(result, requests)


@st.composite
def workloads(draw: st.DrawFn) -> tuple[list[Request], int, int, int, str]:
    tpb = draw(st.sampled_from([1, 2, 4, 8]))
    slots = draw(st.integers(2, 24))
    pool_tokens = tpb * slots
    shared = synthetic_tokens(draw(st.integers(0, 3)), 4 * pool_tokens, stream=1)
    requests = []
    for i in range(draw(st.integers(1, 10))):
        # Mostly requests that fit, some several times the pool.
        length = draw(st.one_of(st.integers(1, pool_tokens // 2 + 1), st.integers(1, 3 * pool_tokens)))
        prefix = draw(st.integers(0, length))  # shared prefixes make reuse and eviction happen
        prompt = np.concatenate([shared[:prefix], synthetic_tokens(i, length - prefix, stream=2)])
        requests.append(
            Request(prompt.astype(np.int32), synthetic_tokens(i, draw(st.integers(0, pool_tokens)), stream=3))
        )
    layers = draw(st.sampled_from(["1", "2", f"1,1x{2 * tpb}+1", "1,1ssm", f"1,1x{2 * tpb},1ssm"]))
    return requests, tpb, slots, draw(st.integers(1, 5)), layers


@settings(max_examples=150)  # cheap: small pools, short requests
@given(workloads())
def test_every_replay_terminates_alike_on_every_backend(backends: list[kv_api.Backend], workload: Any) -> None:
    requests, tpb, slots, in_flight, layers = workload
    runnable = having(backends, *layer_needs(layers))  # those without SSM layers skip a model with them
    assume(runnable)
    results = [replay(b, requests, tpb, slots, in_flight, layers) for b in runnable]
    for result in results:
        check_terminated(result, requests)
    first = results[0]
    event(f"rejected: {any(r.rejected for r in first.records)}")
    event(f"preempted: {any(r.preemptions for r in first.records)}")
    event(f"evicted: {first.evicted_pages > 0}")
    for other in results[1:]:
        assert [(r.reused_tokens, r.preemptions, r.rejected) for r in other.records] == [
            (r.reused_tokens, r.preemptions, r.rejected) for r in first.records
        ]
        assert (other.steps, other.evicted_pages) == (first.steps, first.evicted_pages)


# -- every report mode, with host and disk tiers -----------------------------------------------

MODES = ["table", "json", "compare", "sweep", "cluster"]


def _trace(requests: list[Request], directory: Path) -> Path:
    path = directory / "trace.jsonl"
    lines = [json.dumps({"tokens": r.prompt.tolist(), "output": r.output.tolist()}) for r in requests]
    path.write_text("\n".join(lines) + "\n")
    return path


def _flags(workload: Any, host: str, disk: str, directory: Path) -> list[str]:
    """The command line of ``replay()`` above, with a host and a disk tier (disk under ``directory``)."""
    _, tpb, slots, in_flight, layers = workload
    quota = GRANULE * len(layers.split(","))
    bytes_per_token = GRANULE // (2 * tpb * slots)
    return [
        *("--quiet", "--layers", layers, "--tokens-per-block", str(tpb), "--bytes-per-token", str(bytes_per_token)),
        *("--max-in-flight", str(in_flight), "--quota", str(quota)),
        *("--host-quota", host, "--disk-quota", disk, "--disk-path", str(directory)),
    ]


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = main(list(argv))
    out, err = capsys.readouterr()
    plot = argv[argv.index("--plot") + 1] if "--plot" in argv else None
    said = f"kvcore: wrote the plot to {os.path.abspath(plot)}\n" if plot else ""  # and nothing else
    assert (code, err) == (0, said), err  # compare and sweep: 0 only if every backend agrees
    return out


def _check_summary(s: dict[str, Any]) -> None:
    jsonschema.validate(s, SUMMARY_SCHEMA)
    assert set(s["reused_tokens_by_level"]) == {"device", "host", "disk"}
    assert sum(s["reused_tokens_by_level"].values()) == s["reused_tokens"]
    assert s["completed"] + s["rejected"] == s["requests"]


def _report(capsys: pytest.CaptureFixture[str], mode: str, flags: list[str], as_json: bool, plot: Path | None) -> None:
    """Run one report mode (``--plot`` too, if given); check its JSON, or that its table prints."""
    extra = {
        "table": [],
        "json": [],
        "compare": ["--compare"],
        # A sweep of the device quota (a list after the single --quota replaces it), on every backend.
        "sweep": ["--compare", "--quota", f"{GRANULE},{2 * GRANULE}"],
        "cluster": ["--instances", "2", "--router", "round-robin,kv"],
    }[mode]
    argv = [*flags, *extra, *(["--plot", str(plot)] if plot else [])]
    out = _cli(capsys, *argv, *(["--json"] if as_json else []))
    if plot:
        assert plot.read_bytes()[:4] == b"\x89PNG"
    if not as_json:
        assert out.strip()
        return
    report = json.loads(out)
    if mode in ("table", "json"):
        _check_summary(report)
    elif mode == "compare":
        jsonschema.validate(report, COMPARE_SCHEMA)
        assert report["reuse_identical"]
        for s in report["backends"]:
            _check_summary(s)
    elif mode == "sweep":
        jsonschema.validate(report, SWEEP_SCHEMA)
        assert report["reuse_identical"]
        for s in report["rows"]:
            _check_summary(s)
    else:
        for rep in report if isinstance(report, list) else [report]:
            jsonschema.validate(rep, CLUSTER_SCHEMA)
            assert rep["requests"] == sum(i["requests"] for i in rep["per_instance"])


def _table_matches_json(capsys: pytest.CaptureFixture[str], flags: list[str]) -> None:
    """The table has a row per level and direction the JSON summary has, and no other."""
    summary = json.loads(_cli(capsys, *flags, "--json"))
    labels = [line.split("  ")[0] for line in _cli(capsys, *flags).splitlines()]
    assert [label for label in labels if label.startswith("moved ")] == [
        f"moved {d.replace('->', '→')}" for d in summary["bytes_moved"]
    ]
    for level in ("device", "host", "disk"):
        assert f"reused tokens found on {level}" in labels and f"{level} utilisation at end" in labels


TIER_SIZES = st.sampled_from(["4K", "64K", "1M", "4M"])


def _replayable(monkeypatch: pytest.MonkeyPatch, backend: kv_api.Backend, mode: str, workload: Any) -> None:
    """Reject a drawn model ``backend`` cannot replay (SSM layers); ``--compare`` (compare, sweep)
    replays on the installed backends that have the tiers and the layers."""
    needs = layer_needs(workload[4])
    assume(having([backend], *needs))
    if mode in ("compare", "sweep"):
        compare_on_capable(monkeypatch, "host_tier", "disk_tier", *needs)


@pytest.mark.requires("host_tier", "disk_tier")
@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=8)
@given(workload=workloads(), host=TIER_SIZES, disk=TIER_SIZES, as_json=st.booleans())
def test_every_report_mode_runs_with_tiers(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    backend: kv_api.Backend,
    mode: str,
    workload: Any,
    host: str,
    disk: str,
    as_json: bool,
) -> None:
    """Table, JSON, compare, sweep and cluster reports, each with a host and a disk tier (the
    table once crashed on a direction the JSON had), on random workloads; the disk tier's
    directory is empty after each run."""
    _replayable(monkeypatch, backend, mode, workload)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        (directory / "disk").mkdir()
        flags = ["replay", str(_trace(workload[0], directory)), "--backend", backend.name]
        flags += _flags(workload, host, disk, directory / "disk")
        if mode == "table":
            _table_matches_json(capsys, flags)
        else:  # compare, sweep and cluster print a table or JSON
            _report(capsys, mode, flags, mode == "json" or as_json, None)
        assert list((directory / "disk").iterdir()) == []


@pytest.mark.requires("host_tier", "disk_tier")
@settings(max_examples=4)  # a figure costs ~0.3 s
@given(workload=workloads(), host=TIER_SIZES, disk=TIER_SIZES, mode=st.sampled_from(["json", "sweep", "cluster"]))
def test_every_plot_draws_with_tiers(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    backend: kv_api.Backend,
    workload: Any,
    host: str,
    disk: str,
    mode: str,
) -> None:
    pytest.importorskip("matplotlib")
    _replayable(monkeypatch, backend, mode, workload)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        (directory / "disk").mkdir()
        flags = ["replay", str(_trace(workload[0], directory)), "--backend", backend.name]
        flags += _flags(workload, host, disk, directory / "disk")
        _report(capsys, mode, flags, True, directory / "replay.png")
        assert list((directory / "disk").iterdir()) == []
