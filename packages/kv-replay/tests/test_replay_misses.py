"""``kvcore replay`` says why prompts missed: the missed tokens per reason (table rows and the
JSON's ``misses``) add up with the reused ones to the prompts, and a hint names the dominant
reason: evictions on a small device quota, first sightings on a large one, prompts too large
for a tiny one; none where no reason dominates."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

import kv_api
from kv_replay.cli import main
from kv_replay.miss_report import REPLAY_REASONS
from kv_replay.model import model_config
from kv_replay.plot import reasons_by_step, replay_figure
from kv_replay.prefix_report import TOP, prefix_summary
from kv_replay.replayer import Replayer
from kv_replay.trace import Request, load_trace, synthetic_tokens

FLAGS = ["--quiet"]  # the embedded workload (194 requests)


def replay(capsys: pytest.CaptureFixture[str], backend: kv_api.Backend, *argv: str) -> str:
    code = main(["replay", *FLAGS, "--backend", backend.name, *argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


@pytest.mark.parametrize(("quota", "reason"), [("64M", "evicted"), ("512M", "never_seen"), ("1M", "rejected")])
def test_misses_add_up_and_the_hint_names_the_dominant_reason(
    capsys: pytest.CaptureFixture[str], backend: kv_api.Backend, quota: str, reason: str
) -> None:
    summary = json.loads(replay(capsys, backend, "--quota", quota, "--json"))
    tokens = summary["misses"]["tokens"]
    assert set(tokens) == set(REPLAY_REASONS)
    assert summary["reused_tokens"] + sum(tokens.values()) == summary["prompt_tokens"]
    missed = sum(tokens.values())
    assert max(tokens, key=tokens.__getitem__) == reason and tokens[reason] >= 0.6 * missed, tokens
    hint = summary["misses"]["hint"]
    assert hint.startswith(f"{tokens[reason] / missed:.0%} of missed tokens")
    assert ("--quota" in hint) == (reason in ("evicted", "rejected"))
    table = replay(capsys, backend, "--quota", quota)
    assert f"missed: {reason.replace('_', ' ')}" in table and f"{tokens[reason]:,}" in table
    assert f"hint: {hint}" in table.splitlines()


def test_no_dominant_reason_no_hint(capsys: pytest.CaptureFixture[str], backend: kv_api.Backend) -> None:
    summary = json.loads(replay(capsys, backend, "--quota", "16M", "--json"))
    tokens = summary["misses"]["tokens"]
    assert max(tokens.values()) < 0.6 * sum(tokens.values()) and summary["misses"]["hint"] is None


def test_the_most_missed_shared_prefixes(capsys: pytest.CaptureFixture[str], backend: kv_api.Backend) -> None:
    """On a small device the documents' readers miss what earlier readers left: each document
    is a prefix shared by its readers, named by its first reader, ranked by evicted tokens."""
    summary = json.loads(replay(capsys, backend, "--quota", "64M", "--json"))
    prefixes = summary["prefixes"]
    assert 0 < len(prefixes) <= TOP
    evicted = [p["evicted_tokens"] for p in prefixes]
    assert evicted == sorted(evicted, reverse=True) and evicted[0] > 0
    assert sum(evicted) <= summary["misses"]["tokens"]["evicted"]
    assert all(p["requests"] > 1 and p["reused_tokens"] <= p["prompt_tokens"] for p in prefixes)
    table = replay(capsys, backend, "--quota", "64M")
    first = prefixes[0]
    assert f"as in {first['first_request']}" in table and f"{first['evicted_tokens']:,}" in table
    assert json.loads(replay(capsys, backend, "--quota", "512M", "--json"))["misses"]["tokens"]["evicted"] == 0
    assert "most-missed shared prefixes" not in replay(capsys, backend, "--quota", "512M")


def test_prefixes_group_by_scope_and_first_block(backend: kv_api.Backend) -> None:
    """Two requests with the same first block share a prefix; the same tokens under another
    salt, or a prompt shorter than a block, do not. A tiny device evicts between them."""
    doc, other = synthetic_tokens(1, 64), synthetic_tokens(2, 64)
    salted = kv_api.ReuseScope(salt=7)
    requests = [
        Request(doc, synthetic_tokens(3, 2), name="a"),
        Request(other, synthetic_tokens(4, 2), name="b"),
        Request(doc, synthetic_tokens(5, 2), salted, name="c"),
        Request(doc.copy(), synthetic_tokens(6, 2), name="d"),
        Request(doc[:8], synthetic_tokens(7, 2), name="e"),
    ]
    config = model_config("1", 16, 2 << 20, (2 << 20) // (2 * 16 * 5))  # 5 slots: one prompt's
    result = Replayer(backend, config, 1).run(requests)
    assert [r.prefix is None for r in result.records] == [False, False, False, False, True]
    (prefix,) = prefix_summary(result)
    assert (prefix["first_request"], prefix["requests"]) == ("a", 2)
    assert prefix["evicted_tokens"] == 64 and prefix["prompt_tokens"] == 128


def test_the_hint_gives_eviction_ages_in_the_trace_seconds(
    capsys: pytest.CaptureFixture[str], backend: kv_api.Backend, tmp_path: Path
) -> None:
    """Mooncake timestamps are milliseconds: two documents asked for in turn, a second apart, on
    a device that holds one: each is evicted by the other, 1 s (one request) before it returns."""
    lines = [
        {"timestamp": 1000 * i, "input_length": 1000, "output_length": 2, "hash_ids": [i % 2 * 10, i % 2 * 10 + 1]}
        for i in range(6)
    ]
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert [r.seconds for r in load_trace(trace)] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    summary = json.loads(replay(capsys, backend, str(trace), "--quota", "2M", "--tokens-per-block", "16", "--json"))
    assert "were evicted, half of them within 1 request (1.0 s of the trace's time)" in summary["misses"]["hint"]


def test_the_reasons_by_step_add_up(backend: kv_api.Backend) -> None:
    requests = [Request(synthetic_tokens(i % 3, 96), synthetic_tokens(10 + i, 3)) for i in range(12)]
    result = Replayer(backend, model_config("1", 16, 2 << 20, (2 << 20) // (2 * 16 * 24)), 2).run(requests)
    names, shares = reasons_by_step(result)
    assert names[0] == "reused" and "never seen" in names and shares.shape == (len(names), result.steps)
    counted = shares.sum(axis=0)
    assert np.allclose(counted[counted > 0], 1.0)
    prompt = sum(r.prompt_tokens for r in result.records)
    assert shares[0, -1] * prompt == pytest.approx(sum(r.reused_tokens for r in result.records))
    if importlib.util.find_spec("matplotlib") is not None:  # the plot's third panel stacks them
        fig = replay_figure([result], trace="t", quota=2 << 20, tokens_per_block=16)
        assert fig.axes[2].get_legend_handles_labels()[1] == names
