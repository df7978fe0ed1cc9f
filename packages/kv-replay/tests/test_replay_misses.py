"""``kvcore replay`` says why prompts missed: the missed tokens per reason (table rows and the
JSON's ``misses``) add up with the reused ones to the prompts, and a hint names the dominant
reason: evictions on a small device quota, first sightings on a large one, prompts too large
for a tiny one; none where no reason dominates."""

from __future__ import annotations

import json

import pytest

import kv_api
from kv_replay.cli import main
from kv_replay.miss_report import REPLAY_REASONS

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
    assert table.rstrip().endswith(hint)


def test_no_dominant_reason_no_hint(capsys: pytest.CaptureFixture[str], backend: kv_api.Backend) -> None:
    summary = json.loads(replay(capsys, backend, "--quota", "16M", "--json"))
    tokens = summary["misses"]["tokens"]
    assert max(tokens.values()) < 0.6 * sum(tokens.values()) and summary["misses"]["hint"] is None
