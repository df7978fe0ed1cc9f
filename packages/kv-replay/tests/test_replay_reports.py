"""Every report names what was replayed: the trace, the backend, the model's layout (layers, block
size, bytes per token) and the quotas, above the table and as JSON fields; counts read right
("1 instance"); ``--plot`` says where it wrote; ``--help`` shows every form of ``--layers``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

import kv_api
from kv_replay.cli import main
from kv_replay.cluster import CLUSTER_SCHEMA
from kv_replay.header import layout, quotas
from kv_replay.plural import plural
from kv_replay.report import COMPARE_SCHEMA, SUMMARY_SCHEMA, SWEEP_SCHEMA

FLAGS = ["--quiet", "--limit", "12", "--layers", "2,1x64+2", "--tokens-per-block", "16", "--bytes-per-token", "128"]
MODEL = (
    "3 layers: 2 full-attention, 1 sliding-window (window 64, 2 sink tokens), 16 tokens per block, 128 bytes per token"
)
NAMED = {"layers": "2,1x64+2", "num_layers": 3, "tokens_per_block": 16, "bytes_per_token": 128}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[str, str]:
    code = main(["replay", "mooncake-synthetic", *FLAGS, *argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out, err


def header(out: str) -> list[str]:
    """The lines above the table (a blank line ends them)."""
    return out.split("\n\n")[0].splitlines()


def named(summary: dict[str, Any], backend: str) -> None:
    assert summary["trace"] == "mooncake-synthetic" and summary["backend"] == backend
    assert {key: summary[key] for key in NAMED} == NAMED


def test_the_table_names_trace_backend_model_and_quotas(
    capsys: pytest.CaptureFixture[str], backend: kv_api.Backend
) -> None:
    out, _ = run(capsys, "--backend", backend.name, "--quota", "8M")
    assert header(out) == [
        "trace: mooncake-synthetic, 12 requests",
        f"backend: {backend.name}",
        f"model: {MODEL} (K and V each, per layer)",
        "quotas: device 8M; no host or disk tier",
    ]
    out, _ = run(capsys, "--backend", backend.name, "--quota", "8M", "--json")
    summary = json.loads(out)
    jsonschema.validate(summary, SUMMARY_SCHEMA)
    named(summary, backend.name)
    assert (summary["quota"], summary["host_quota"], summary["disk_quota"]) == (8 << 20, None, None)


def test_the_comparison_names_every_backend(capsys: pytest.CaptureFixture[str]) -> None:
    names = list(kv_api.available_backends())
    out, _ = run(capsys, "--compare", "--quota", "8M")
    assert header(out)[1] == f"backends: {', '.join(names)}"
    assert header(out)[3] == "quotas: device 8M; no host or disk tier"
    out, _ = run(capsys, "--compare", "--quota", "8M", "--json")
    report = json.loads(out)
    jsonschema.validate(report, COMPARE_SCHEMA)
    for summary, name in zip(report["backends"], names, strict=True):
        named(summary, name)


def test_the_sweep_names_the_quotas_it_swept(capsys: pytest.CaptureFixture[str], backend: kv_api.Backend) -> None:
    out, _ = run(capsys, "--backend", backend.name, "--quota", "8M,4M")
    assert header(out)[3] == "quotas: device 4M, 8M (swept); no host or disk tier"
    out, _ = run(capsys, "--backend", backend.name, "--quota", "8M,4M", "--json")
    report = json.loads(out)
    jsonschema.validate(report, SWEEP_SCHEMA)
    for summary in report["rows"] + report["unbounded"]:
        named(summary, backend.name)
    assert [s["quota"] for s in report["rows"]] == [4 << 20, 8 << 20]


@pytest.mark.requires("host_tier")
def test_tier_quotas_are_named(capsys: pytest.CaptureFixture[str], backend: kv_api.Backend) -> None:
    out, _ = run(capsys, "--backend", backend.name, "--quota", "8M", "--host-quota", "16M")
    assert header(out)[3] == "quotas: device 8M; host 16M; no disk tier"


def test_a_cluster_report_names_them_and_counts_read_right(
    capsys: pytest.CaptureFixture[str], backend: kv_api.Backend
) -> None:
    out, _ = run(
        capsys, "--backend", backend.name, "--quota", "8M", "--instances", "1", "--router", "kv", "--limit", "1"
    )
    assert header(out) == [
        "trace: mooncake-synthetic, 1 request",
        f"backend: {backend.name}, 1 instance, router kv",
        f"model: {MODEL} (K and V each, per layer)",
        "quotas: device 8M; no host or disk tier (each instance)",
    ]
    table = out.split("\n\n")[1]
    assert " over 1 request on 1 instance; " in table and "  instance 0: 1 request, " in table
    argv = ["--backend", backend.name, "--quota", "8M", "--instances", "2", "--router", "kv,round-robin", "--json"]
    out, _ = run(capsys, *argv)
    reports = json.loads(out)
    assert [r["router"] for r in reports] == ["kv", "round-robin"]
    for report in reports:
        jsonschema.validate(report, CLUSTER_SCHEMA)
        named(report, backend.name)
        assert (report["quota"], report["host_quota"], report["disk_quota"]) == (8 << 20, None, None)
        assert report["instances"] == 2


def test_plot_says_where_it_wrote(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    for extra in ([], ["--quota", "4M,8M"], ["--instances", "2"]):
        (tmp_path / "r.png").unlink(missing_ok=True)
        out, err = run(capsys, "--plot", "r.png", *extra)  # relative: the message names it in full
        assert err == f"kvcore: wrote the plot to {tmp_path / 'r.png'}\n", extra
        assert (tmp_path / "r.png").stat().st_size > 0 and "wrote" not in out


def test_layouts_quotas_and_counts_in_words() -> None:
    assert layout("4") == "4 full-attention layers"
    assert layout("1") == "1 full-attention layer"
    assert layout("1ssm") == "1 SSM layer"
    assert layout("8x4096+1") == "8 sliding-window layers (window 4,096, 1 sink token)"
    assert layout("24,8x4096+4,2ssm") == (
        "34 layers: 24 full-attention, 8 sliding-window (window 4,096, 4 sink tokens), 2 SSM"
    )
    assert quotas([1 << 30], None, None) == "device 1G; no host or disk tier"
    assert quotas([1 << 28, 1 << 30], [1 << 20], 5 << 30) == "device 256M, 1G (swept); host 1M; disk 5G"
    assert quotas([1 << 28], None, 1 << 30) == "device 256M; disk 1G; no host tier"
    counts = [plural(n, "instance") for n in (0, 1, 2, 1000)]
    assert counts == ["0 instances", "1 instance", "2 instances", "1,000 instances"]
    assert plural(1, "batch", "batches") == "1 batch" and plural(3, "batch", "batches") == "3 batches"


def test_help_shows_every_form_of_layers(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["replay", "--help"])
    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines anywhere
    assert "COUNT[xWINDOW][+SINKS] or COUNTssm" in text
    assert "e.g. 24,8x4096+4,2ssm is 24 full-attention layers, 8 sliding-window layers" in text
    assert "2 state-space (SSM) layers" in text


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("-1G", "--quota: '-1G': a size cannot be negative"),
        ("1G,-2G", "--quota: '-2G': a size cannot be negative"),
        ("-", "--quota: not a size: '-' (e.g. 268435456, 256M, 1G, 1.5T)"),  # no size, so not a negative one
    ],
)
def test_a_negative_quota_says_what_is_wrong(capsys: pytest.CaptureFixture[str], value: str, message: str) -> None:
    assert main(["replay", "--quota", value]) == 2  # its own word, as a user types it
    assert capsys.readouterr() == ("", f"kvcore: error: {message}\n")
