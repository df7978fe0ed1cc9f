"""Host and disk tiers in `kvcore replay`: reuse found below the device, bytes moved, onboarding
latency, the host-quota sweep, the temporary disk directory, and the tier flags' errors."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import jsonschema
import pytest
from replay_gates import compare_on_capable

import kv_api
from kv_api.capabilities import Capabilities
from kv_replay.cli import main
from kv_replay.model import ModelError
from kv_replay.replay_command import check_tiers
from kv_replay.report import SUMMARY_SCHEMA, SWEEP_SCHEMA

# Blocks of 16 tokens and 128 KiB: the smallest device quota (2M) holds 16 of them.
BIG_BLOCKS = ["--quiet", "--layers", "1", "--tokens-per-block", "16", "--bytes-per-token", "4096"]
DOCUMENTS = 6  # of 4 blocks and a partial one each: 30 blocks, read round-robin


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def cycling(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six documents read three times round-robin, one request at a time: LRU on a device that
    holds about three of them evicts each before it is read again, so every reuse comes from
    a lower tier."""
    path = tmp_path_factory.mktemp("trace") / "cycling.jsonl"
    lines = [
        {"tokens": [1000 * d + i for i in range(64)] + [7, r], "output_length": 2}
        for r in range(3)
        for d in range(DOCUMENTS)
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


def replay_json(capsys: pytest.CaptureFixture[str], trace: Path, backend: kv_api.Backend, *flags: str) -> Any:
    argv = ["replay", str(trace), *BIG_BLOCKS, "--backend", backend.name, "--max-in-flight", "1", "--json"]
    code, out, err = run(capsys, *argv, *flags)
    assert code == 0, err
    return json.loads(out)


@pytest.mark.requires("host_tier")
def test_a_host_tier_brings_evicted_prefixes_back(
    capsys: pytest.CaptureFixture[str], cycling: Path, backend: kv_api.Backend
) -> None:
    without = replay_json(capsys, cycling, backend, "--quota", "2M")
    with_host = replay_json(capsys, cycling, backend, "--quota", "2M", "--host-quota", "4M")
    for s in (without, with_host):
        jsonschema.validate(s, SUMMARY_SCHEMA)
        assert sum(s["reused_tokens_by_level"].values()) == s["reused_tokens"]
    assert without["reused_tokens_by_level"] == {"device": 0} and without["bytes_moved"] == {}
    assert without["host_quota"] is None and without["onboarded_pages"] == 0
    # Every document is evicted from the device before it is read again; the host keeps them all.
    assert with_host["host_quota"] == 4 << 20 and with_host["disk_quota"] is None
    assert with_host["reused_tokens_by_level"]["host"] > 0
    assert with_host["bytes_moved"]["device->host"] > 0 and with_host["bytes_moved"]["host->device"] > 0
    assert with_host["evictions"] > 0 and with_host["onboarded_pages"] > 0
    onboarding = with_host["resume_latency_us"]["onboarding"]
    assert onboarding["count"] > 0 and onboarding["p99"] >= onboarding["p50"] > 0
    assert set(with_host["level_utilization"]) == {"device", "host"}
    assert with_host["hit_rate"] > without["hit_rate"]


@pytest.mark.requires("host_tier")
@pytest.mark.parametrize("host_quota", ["4K", "1M", "2M", "4M", "64M"])
def test_a_host_tier_never_lowers_the_hit_rate(
    capsys: pytest.CaptureFixture[str], cycling: Path, backend: kv_api.Backend, host_quota: str
) -> None:
    """More capacity can only help LRU with one request in flight (a larger LRU cache holds a
    superset of a smaller one's blocks), from a host tier too small to hold a document to one
    that holds the whole trace."""
    without = replay_json(capsys, cycling, backend, "--quota", "2M")
    with_host = replay_json(capsys, cycling, backend, "--quota", "2M", "--host-quota", host_quota)
    assert with_host["hit_rate"] >= without["hit_rate"]
    assert with_host["rejected"] == without["rejected"] == 0


@pytest.mark.requires("host_tier")
def test_the_embedded_workload_reuses_at_least_as_much_with_a_host_tier(
    capsys: pytest.CaptureFixture[str], backend: kv_api.Backend
) -> None:
    flags = ["replay", "--quiet", "--limit", "60", "--quota", "4M", "--backend", backend.name, "--json"]
    code, out, err = run(capsys, *flags)
    assert code == 0, err
    without = json.loads(out)
    code, out, err = run(capsys, *flags, "--host-quota", "16M")
    assert code == 0, err
    with_host = json.loads(out)
    assert with_host["reused_tokens_by_level"]["host"] > 0
    assert with_host["hit_rate"] >= without["hit_rate"]


@pytest.mark.requires("host_tier")
def test_the_text_report_shows_levels_directions_and_onboarding(
    capsys: pytest.CaptureFixture[str], cycling: Path, backend: kv_api.Backend
) -> None:
    argv = ["replay", str(cycling), *BIG_BLOCKS, "--backend", backend.name, "--max-in-flight", "1"]
    code, out, err = run(capsys, *argv, "--quota", "2M", "--host-quota", "4M")
    assert code == 0, err
    assert "\nquotas: device 2M; host 4M; no disk tier\n" in out
    assert any(line.startswith("host quota") and line.endswith(" 4M") for line in out.splitlines())
    for row in (
        "reused tokens found on host",
        "moved device→host",
        "MiB",
        "onboarded pages",
        "onboarding resume p50",
        "other resume p99",
        "host utilisation at end",
    ):
        assert row in out, row
    code, out, err = run(capsys, *argv, "--quota", "2M")
    header, table = out.split("\n\n")[:2]  # then the most-missed prefixes, if any
    assert header.endswith("quotas: device 2M; no host or disk tier")
    rows = "\n".join(line for line in table.splitlines() if not line.startswith("hint:"))  # a hint may name flags
    assert code == 0 and "host" not in rows and "moved" not in rows  # no tiers: the table of before


def test_the_text_report_shows_every_direction_moved_on_every_backend(
    capsys: pytest.CaptureFixture[str], cycling: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The regression: a reused partial block copied on the device (``device->device``), next to
    evictions to the host and onboarding, crashed the table (KeyError) while --json worked."""
    compare_on_capable(monkeypatch, "host_tier")  # --compare: the installed backends with a host tier
    trace = tmp_path / "trace.jsonl"
    # After the cycling documents, a prompt that extends the one before it: its partial last
    # block is reused and copied into the new cache's own page, on the device.
    extend = [{"tokens": list(range(9000, 9000 + n)), "output_length": 2} for n in (20, 22)]
    trace.write_text(cycling.read_text() + "".join(json.dumps(line) + "\n" for line in extend))
    argv = ["replay", str(trace), *BIG_BLOCKS, "--max-in-flight", "1", "--quota", "2M", "--host-quota", "4M"]
    code, out, err = run(capsys, *argv, "--compare", "--json")
    assert code == 0, err
    moved = [s["bytes_moved"] for s in json.loads(out)["backends"]]
    assert all(m == moved[0] for m in moved)
    assert {"device->device", "device->host", "host->device"} <= set(moved[0])
    code, out, err = run(capsys, *argv, "--compare")
    assert code == 0, err
    rows = {line.split("  ")[0]: line.split()[2:] for line in out.splitlines() if line.startswith("moved ")}
    assert sorted(rows) == sorted(f"moved {d.replace('->', '→')}" for d in moved[0])
    for cells in rows.values():  # one size per backend, "2.0 KiB" as two words: the same on each
        assert len(cells) == 2 * len(moved) and len(set(zip(cells[::2], cells[1::2], strict=True))) == 1


@pytest.mark.requires("host_tier", "disk_tier")
def test_the_temporary_disk_directory_is_removed_after_the_run(
    capsys: pytest.CaptureFixture[str], cycling: Path, backend: kv_api.Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[str] = []
    mkdtemp = tempfile.mkdtemp

    def spy(*args: Any, **kwargs: Any) -> str:
        made.append(mkdtemp(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(tempfile, "mkdtemp", spy)
    s = replay_json(capsys, cycling, backend, "--quota", "2M", "--host-quota", "1M", "--disk-quota", "4M")
    # The host holds too little: the documents come back from disk, so the directory was used.
    assert s["reused_tokens_by_level"]["disk"] > 0 and s["bytes_moved"]["host->disk"] > 0
    assert s["disk_quota"] == 4 << 20
    assert len(made) == 1 and "kvcore-replay-" in made[0]
    assert not Path(made[0]).exists()


@pytest.mark.requires("disk_tier")
def test_an_explicit_disk_path_is_kept_and_left_empty(
    capsys: pytest.CaptureFixture[str], cycling: Path, backend: kv_api.Backend, tmp_path: Path
) -> None:
    s = replay_json(capsys, cycling, backend, "--quota", "2M", "--disk-quota", "4M", "--disk-path", str(tmp_path))
    assert s["reused_tokens_by_level"]["disk"] > 0 and s["host_quota"] is None
    assert tmp_path.is_dir() and list(tmp_path.iterdir()) == []  # the manager's files went at shutdown


@pytest.mark.requires("host_tier")
def test_the_sweep_varies_the_host_quota(
    capsys: pytest.CaptureFixture[str], cycling: Path, backend: kv_api.Backend
) -> None:
    argv = ["replay", str(cycling), *BIG_BLOCKS, "--backend", backend.name, "--max-in-flight", "1"]
    code, out, err = run(capsys, *argv, "--quota", "2M", "--host-quota", "4M,1M", "--json")
    assert code == 0, err
    report = json.loads(out)
    jsonschema.validate(report, SWEEP_SCHEMA)
    assert [r["host_quota"] for r in report["rows"]] == [1 << 20, 4 << 20]
    assert {r["quota"] for r in report["rows"]} == {2 << 20}
    assert report["rows"][0]["hit_rate"] <= report["rows"][1]["hit_rate"] <= report["unbounded"][0]["hit_rate"]
    assert report["unbounded"][0]["host_quota"] is None
    code, out, err = run(capsys, *argv, "--quota", "2M", "--host-quota", "1M,4M")
    assert code == 0, err
    named, table = out.split("\n\n")
    assert named.endswith("\nquotas: device 2M; host 1M, 4M (swept); no disk tier")
    header, _, first, second, unbounded = table.splitlines()
    assert "host quota" in header and "reused from below device" in header
    assert first.split()[:3] == ["2M", "1M", backend.name] and second.split()[:3] == ["2M", "4M", backend.name]
    assert unbounded.split()[:2] == ["unbounded", "-"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--host-quota", "lots"], "--host-quota: not a size: 'lots'"),
        (["--host-quota", "0"], "--host-quota: '0' must be at least 1 byte"),
        (["--disk-quota", "1X"], "--disk-quota: not a size: '1X'"),
        (["--disk-quota", "1G,2G"], "--disk-quota: one size, not a list"),
        # A negative size as its own word once read as a flag: "expected one argument".
        (["--host-quota", "-5M"], "--host-quota: '-5M': a size cannot be negative"),
        (["--disk-quota", "-1"], "--disk-quota: '-1': a size cannot be negative"),
        (["--quota", "1G,-2G"], "--quota: '-2G': a size cannot be negative"),
        (["--disk-quota", "1G", "--disk-path", "/nonexistent/dir"], "--disk-path: directory /nonexistent/dir does not"),
        (["--disk-path", "."], "--disk-path: needs --disk-quota"),
        (["--quota", "2M,4M", "--host-quota", "4M,8M"], "--host-quota: a sweep varies one quota"),
    ],
)
def test_a_bad_tier_flag_is_one_line_naming_it(
    capsys: pytest.CaptureFixture[str], cycling: Path, flags: list[str], message: str
) -> None:
    code, out, err = run(capsys, "replay", str(cycling), *BIG_BLOCKS, *flags)
    assert code == 2 and out == ""  # nothing replayed
    assert err.count("\n") == 1 and err.startswith(f"kvcore: error: {message}"), err


@pytest.mark.requires("disk_tier")
def test_a_disk_error_names_the_directory_the_user_knows(
    capsys: pytest.CaptureFixture[str],
    cycling: Path,
    backend: kv_api.Backend,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without --disk-path the files go to a temporary directory inside $TMPDIR, removed by the
    time the message is read: the message names $TMPDIR."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    code, out, err = run(capsys, "replay", str(cycling), *BIG_BLOCKS, "--backend", backend.name, "--disk-quota", "1P")
    if code == 0:
        pytest.skip("this file system takes a sparse file of 1 PiB")
    assert (code, out) == (2, "") and err.startswith("kvcore: error: --disk-quota 1P: disk tier: "), err
    assert err.endswith(f" in {tmp_path}\n") and "kvcore-replay-" not in err, err
    assert list(tmp_path.iterdir()) == []


def test_a_disk_path_that_is_a_file_is_named(capsys: pytest.CaptureFixture[str], cycling: Path) -> None:
    code, out, err = run(capsys, "replay", str(cycling), *BIG_BLOCKS, "--disk-quota", "4M", "--disk-path", str(cycling))
    assert (code, out, err) == (2, "", f"kvcore: error: --disk-path: {cycling} is not a directory\n")


@pytest.mark.requires("host_tier")
def test_a_host_quota_beyond_the_address_space_names_the_host_quota(
    capsys: pytest.CaptureFixture[str], cycling: Path, backend: kv_api.Backend
) -> None:
    code, out, err = run(capsys, "replay", str(cycling), *BIG_BLOCKS, "--backend", backend.name, "--host-quota", "1P")
    assert code == 2 and out == "" and err.startswith("kvcore: error: --host-quota 1P: cannot map "), err


def test_a_backend_without_the_tier_is_refused_naming_the_flag() -> None:
    bare = cast(kv_api.Backend, SimpleNamespace(name="bare", capabilities=Capabilities()))
    args = argparse.Namespace(host_quota=[1 << 20], disk_quota=None)
    with pytest.raises(ModelError, match=r"^--host-quota: backend 'bare' has no host tier$"):
        check_tiers(args, [bare])
    args = argparse.Namespace(host_quota=None, disk_quota=1 << 20)
    with pytest.raises(ModelError, match=r"^--disk-quota: backend 'bare' has no disk tier$"):
        check_tiers(args, [bare])
