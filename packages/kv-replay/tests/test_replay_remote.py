"""``kvcore replay --remote``: a store the run shares (a directory kept across runs, an embedded
valkey-server, a server at a URL), what the report adds, the cluster replayed without and with
the shared store, and the flag's errors. The servers are real ones the run starts."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest

import kv_api
from kv_replay.cli import main
from kv_replay.cluster import CLUSTER_SCHEMA
from kv_replay.report import SUMMARY_SCHEMA

pytestmark = pytest.mark.requires("remote_tier")
kv_store = pytest.importorskip("kv_store")

# Blocks of 16 tokens and 16 KiB, an 8 MiB device (512 blocks, a few prompts of the embedded
# workload), two requests at a time, its first 40 requests.
SMALL = ["--quiet", "--layers", "1", "--tokens-per-block", "16", "--bytes-per-token", "512", "--quota", "8M"]
SMALL += ["--max-in-flight", "2", "--limit", "40", "--json"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def replay(capsys: pytest.CaptureFixture[str], backend: kv_api.Backend, *flags: str) -> Any:
    code, out, err = run(capsys, "replay", *SMALL, "--backend", backend.name, *flags)
    assert code == 0, err
    return json.loads(out)


def test_a_directory_store_warms_the_next_run(
    capsys: pytest.CaptureFixture[str], backend: kv_api.Backend, tmp_path: Path
) -> None:
    store = f"file:{tmp_path / 'store'}"
    cold = replay(capsys, backend, "--remote", store)
    jsonschema.validate(cold, SUMMARY_SCHEMA)
    assert cold["remote"]["written"] > 0 and cold["remote"]["bytes_out"] > 0
    baseline = replay(capsys, backend)
    assert baseline["remote"] is None
    warm = replay(capsys, backend, "--remote", store)
    # Yesterday's blocks: the warm run finds what the cold one evicted and wrote through.
    assert warm["remote"]["blocks"] > cold["remote"]["blocks"]
    assert warm["hit_rate"] > baseline["hit_rate"]
    assert warm["reused_tokens_by_level"]["remote"] > 0
    assert warm["remote"]["rejected"] == 0 and warm["remote"]["errors"] == 0


def test_a_cluster_shares_an_embedded_valkey(capsys: pytest.CaptureFixture[str], backend: kv_api.Backend) -> None:
    pytest.importorskip("redis")
    report = replay(capsys, backend, "--instances", "3", "--remote", "valkey")
    jsonschema.validate(report, CLUSTER_SCHEMA)
    assert report["hit_rate_without_store"] is not None
    assert report["hit_rate"] > report["hit_rate_without_store"]
    assert report["remote"]["blocks"] > 0 and report["remote"]["store_errors"] == 0
    # The embedded server is gone with the run.
    left = subprocess.run(["pgrep", "-f", "valkey-server"], capture_output=True, text=True, check=False)
    assert str(Path.cwd()) not in left.stdout  # nothing of ours (other sessions may run servers)


def test_a_dead_server_costs_misses_and_the_password_is_never_shown(
    capsys: pytest.CaptureFixture[str], backend: kv_api.Backend
) -> None:
    pytest.importorskip("redis")
    url = "redis://kvuser:s3cret-pw@127.0.0.1:9"  # the discard port: nothing answers
    code, out, err = run(capsys, "replay", *SMALL[:-1], "--backend", backend.name, "--remote", url)
    assert code == 0, err
    assert "s3cret-pw" not in out + err and "kvuser" not in out + err
    assert "redis://127.0.0.1:9" in out
    assert "store errors (misses)" in out


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--remote", "bogus"], "--remote: expected redis://HOST:PORT, rediss://HOST:PORT, valkey or file:DIR"),
        (["--remote", "file:"], "--remote: expected"),
        (["--remote", "valkey", "--compare"], "--remote: not with --compare"),
        (["--remote", "valkey", "--quota", "2M,4M"], "--remote: not with a --quota list"),
        (["--remote", "file:/nonexistent/kv-store"], "--remote file:/nonexistent/kv-store: "),
    ],
)
def test_bad_remote_flags_are_one_line(capsys: pytest.CaptureFixture[str], flags: list[str], message: str) -> None:
    code, _, err = run(capsys, "replay", "--quiet", "--limit", "2", *flags)
    assert code == 2
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) <= 3  # argparse's usage line, then the error
