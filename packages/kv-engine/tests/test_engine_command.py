"""``kvcore engine``: a trace through the reference engine's real forwards, on every backend.

Its report must say what the engine did (reused tokens, prefill computed, per-level reuse,
waves), ``--check`` must pass where reuse is exact (float64: Llama, Falcon-H1, from the device
and from the host tier) and must name a request whose tokens differ, and every bad flag is one
line naming it, exit status 2. The runs are small: a few short requests, few new tokens.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from engine_reference import model, tokens

import kv_api
import kv_engine
from kv_replay import engine_command
from kv_replay.cli import main

QUIET = ["--quiet"]
PREFIX = [1000 + t for t in range(64)]  # ids beyond the vocabulary of 256: taken modulo it


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["engine", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def report(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code, out, err = run(capsys, *argv, "--json", *QUIET)
    assert code == 0, err
    assert err == ""
    result: dict[str, Any] = json.loads(out)
    return result


def write(tmp_path: Path, lines: list[dict[str, Any]]) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def shared_prefix(tmp_path: Path) -> Path:
    """Two waves of two: requests 0, 1 and 2 start with the same 64 tokens; 2 reuses them."""
    return write(
        tmp_path,
        [
            {"tokens": PREFIX + tokens(1, 10), "output_length": 4, "name": "first"},
            {"tokens": PREFIX + tokens(2, 20), "output_length": 4, "name": "second"},
            {"tokens": PREFIX + tokens(3, 5), "output_length": 9, "name": "third"},
            {"tokens": tokens(4, 40), "output_length": 1, "name": "other"},
        ],
    )


def assert_one_line_error(code: int, out: str, err: str, names: str) -> None:
    assert code == 2, err
    assert out == ""
    assert err.count("\n") == 1 and err.startswith(f"kvcore: error: {names}"), err
    assert "Traceback" not in err


def test_the_model_names_are_kv_engines() -> None:
    assert engine_command.MODELS == kv_engine.MODEL_NAMES


def test_llama_on_the_embedded_workload(capsys: pytest.CaptureFixture[str], backend: kv_api.Backend) -> None:
    """Sessions 4 and 5 share their system prompts with sessions 0 and 1, two waves earlier: they
    reuse them, every output equals the no-reuse run's, and the counts add up."""
    r = report(
        capsys, "--model", "llama", "--backend", backend.name, "--limit", "6", "--max-running", "2",
        "--max-new-tokens", "3", "--prefill-chunk", "256", "--check",
    )  # fmt: skip
    assert r["check"]["identical"] and r["check"]["mismatches"] == []
    assert r["requests"] == 6 and r["waves"] == 3 and r["backend"] == backend.name
    per = r["per_request"]
    assert [p["reused_tokens"] > 0 for p in per] == [False] * 4 + [True] * 2
    assert r["reused_tokens"] == sum(p["reused_tokens"] for p in per) == r["reused_by_level"]["device"] > 0
    assert r["preemptions"] == 0
    assert r["prefill_tokens_computed"] == r["prompt_tokens"] - r["reused_tokens"]
    assert r["generated_tokens"] == 6 * 3 and r["decode_tokens_computed"] == 6 * 2
    baseline = r["check"]["no_reuse"]
    assert baseline["reused_tokens"] == 0 and baseline["prefill_tokens_computed"] == r["prompt_tokens"]
    assert r["tokens_per_s"] > 0 and 0 < r["ttft_p50_s"] <= r["ttft_p99_s"]


def test_a_device_level_under_pressure(capsys: pytest.CaptureFixture[str], backend: kv_api.Backend) -> None:
    """With the device level alone and too small for a wave, requests are preempted (closed and
    matched again) and still finish: a waiting request's cache must not keep its matched pages
    held, which nothing evicts (it once made a running request unable to grow)."""
    r = report(
        capsys, "--model", "llama", "--backend", backend.name, "--limit", "20", "--device-quota", "3M",
        "--max-new-tokens", "2", "--prefill-chunk", "256",
    )  # fmt: skip
    assert r["requests"] == 20 and r["generated_tokens"] == 40
    assert r["preemptions"] > 0 and r["reused_tokens"] > 0


@pytest.mark.parametrize("name", ["llama", "hybrid"])
def test_a_shared_prefix_is_reused_exactly(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, backend: kv_api.Backend, name: str
) -> None:
    """The text report: the third request reuses the 64-token prefix (the hybrid from the SSM
    snapshot at token 64), the fourth generates one token, the check passes."""
    trace = shared_prefix(tmp_path)
    argv = [str(trace), "--model", name, "--backend", backend.name, "--max-running", "2", "--check", *QUIET]
    code, out, err = run(capsys, *argv)
    assert code == 0, out + err
    assert err == ""
    prompt = 3 * 64 + 10 + 20 + 5 + 40
    lines = out.splitlines()
    assert lines[0] == f"trace: {trace}, 4 requests"
    assert f"reused tokens            64 of {prompt} prompt tokens (" in out
    assert f"prefill tokens computed  {prompt - 64}\n" in out
    assert f"generated tokens         {4 + 4 + 8 + 1}\n" in out
    assert "in 3 waves" in out  # the third request generates 8, not 4: a wave of its own
    assert "check: every output equals the no-reuse run's (4 requests)" in out


@pytest.mark.parametrize("tiers", [["--host-quota", "16M"], ["--host-quota", "64K", "--disk-quota", "16M"]])
def test_reuse_from_a_lower_tier(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, backend: kv_api.Backend, tiers: list[str]
) -> None:
    """A 2 MiB device level holds 2,048 of Llama's tokens: the fillers push the first request's
    prefix down; the last request reuses it from there, and its tokens are still exact."""
    if not backend.capabilities.host_tier or ("--disk-quota" in tiers and not backend.capabilities.disk_tier):
        pytest.skip(f"backend {backend.name!r} lacks the tiers")
    fillers = [{"tokens": tokens(10 + i, 900), "output_length": 1} for i in range(3)]
    trace = write(
        tmp_path,
        [
            {"tokens": PREFIX + tokens(5, 16), "output_length": 2},
            *fillers,
            {"tokens": PREFIX + tokens(6, 8), "output_length": 2},
        ],
    )
    argv = ["--model", "llama", "--backend", backend.name, "--device-quota", "2M", "--max-running", "1"]
    r = report(capsys, str(trace), *argv, *tiers, "--max-new-tokens", "2", "--check")
    assert r["check"]["identical"]
    assert r["per_request"][-1]["reused_tokens"] == 64
    lower = r["reused_by_level"]["host"] + r["reused_by_level"].get("disk", 0)
    assert lower == 64 and r["reused_by_level"]["device"] == 0


def test_check_names_a_request_that_differs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine that reuses wrongly (here: its third request's second token is off by one) fails
    the check: the request is named, with the token, and the status is 1."""
    generate = kv_engine.Engine.generate

    def wrong(self: kv_engine.Engine, prompts: Any, *args: Any, **kwargs: Any) -> list[kv_engine.Output]:
        outs = generate(self, prompts, *args, **kwargs)
        if self.reuse and len(outs[0].tokens) > 4:  # the third request's wave
            bad = [outs[0].tokens[0], (outs[0].tokens[1] + 1) % 256, *outs[0].tokens[2:]]
            outs[0] = dataclasses.replace(outs[0], tokens=bad)
        return outs

    monkeypatch.setattr(kv_engine.Engine, "generate", wrong)
    code, out, err = run(capsys, str(shared_prefix(tmp_path)), "--model", "llama", "--max-running", "2", "--check")
    assert code == 1, err
    assert "check: 1 of 4 outputs differ from the no-reuse run's:\n" in out
    assert "\n  third (request 2): token 1 is " in out and " with reuse, " in out
    assert "every output equals" not in out


def test_a_checkpoint_directory(capsys: pytest.CaptureFixture[str], tmp_path: Path, backend: kv_api.Backend) -> None:
    model("qwen2").save_pretrained(tmp_path / "qwen2")
    capsys.readouterr()  # transformers' own bar, writing it
    trace = shared_prefix(tmp_path)
    r = report(capsys, str(trace), "--model", str(tmp_path / "qwen2"), "--backend", backend.name, "--check")
    assert r["check"]["identical"] and r["reused_tokens"] > 0
    assert r["model_detail"].startswith(f"{tmp_path / 'qwen2'} (checkpoint): 2 full-attention layers, vocabulary 256")


def test_the_progress_bar(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    trace = str(shared_prefix(tmp_path))
    code, out, err = run(capsys, trace, "--model", "llama", "--limit", "1", "--progress")
    assert code == 0 and "engine (llama, " in err and "1/1" in err
    assert out.startswith(f"trace: {trace}, 1 request\n")  # the bar on stderr only
    code, out, err = run(capsys, trace, "--model", "llama", "--limit", "1")  # stderr is not a terminal
    assert code == 0 and err == "" and out.startswith("trace: ")


def bad_flags(tmp_path: Path) -> list[tuple[list[str], str]]:
    (tmp_path / "empty").mkdir()
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{")
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"tokens": [1, 2, 3], "output_length": 1}\n{"tokens": []}\n')
    return [
        (["--model", "gpt-9"], "--model: 'gpt-9' is neither a built-in model (llama, "),
        (["--model", str(tmp_path / "empty")], f"--model: {tmp_path / 'empty'} has no config.json"),
        (["--model", str(tmp_path / "broken")], f"--model {tmp_path / 'broken'}: cannot load it: "),
        ([], "the following arguments are required: --model"),
        (["--limit", "0"], "--limit: must be in [1, "),
        (["--limit", "-2"], "--limit: must be in [1, "),
        (["--max-running", "x"], "--max-running: expected an integer"),
        (["--max-new-tokens", "0"], "--max-new-tokens: must be in [1, "),
        (["--device-quota", "12X"], "--device-quota: not a size: '12X'"),
        (["--host-quota", "-1G"], "--host-quota: '-1G': a size cannot be negative"),
        (["--host-quota", "1G,2G"], "--host-quota: one size, not a list"),
        (["--disk-path", str(tmp_path)], "--disk-path: needs --disk-quota"),
        (["--prefill-chunk", "24"], "--prefill-chunk: 24 is not a multiple of --tokens-per-block 16"),
        (["--dtype", "int8"], "--dtype: invalid choice: 'int8'"),
        (["--backend", "nosuch"], "--backend: "),
        (["--device-quota", "1P"], "--device-quota 1P: cannot map "),
        ([str(trace)], f"{trace}:2: field 'tokens': must not be empty"),
        ([str(tmp_path / "none.jsonl")], f"{tmp_path / 'none.jsonl'}: No such file or directory"),
    ]


def test_bad_flags_are_one_line_naming_the_flag(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for flags, message in bad_flags(tmp_path):
        model_flag = [] if any(f.startswith("--model") for f in flags) or flags == [] else ["--model", "llama"]
        code, out, err = run(capsys, *model_flag, *flags, *QUIET)
        assert_one_line_error(code, out, err, message)


def _default_signals() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # as a terminal starts it, not ignoring SIGINT


def test_ctrl_c_ends_quietly() -> None:
    """Ctrl-C mid-run: one line, status 130, no traceback."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    argv = ["engine", "--model", "llama", "--limit", "40", "--max-running", "1", "--progress", "--check"]
    p = subprocess.Popen(
        [sys.executable, "-m", "kv_replay.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        preexec_fn=_default_signals,
    )
    assert p.stderr is not None
    seen = b""
    deadline = time.monotonic() + 120
    while b"engine (llama, " not in seen and time.monotonic() < deadline:  # the first wave is done
        seen += os.read(p.stderr.fileno(), 4096) or b""
        assert p.poll() is None, seen
    time.sleep(0.3)  # past the bar's first draw (tqdm's constructor), into the second wave
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, seen + err
    assert out == b""
    assert (seen + err).endswith(b"\nkvcore: interrupted\n")
    assert b"Traceback" not in seen + err


def test_metrics_are_served_while_the_engine_runs(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, backend: kv_api.Backend
) -> None:
    """``--metrics-port``: scraped over HTTP after every wave, the reusing engine ("0") counts
    what the report says it did, the check's engine ("check") reuses nothing, and every
    admission's resume is in the latency histogram; the endpoint goes with the command."""
    pytest.importorskip("kv_metrics")
    import urllib.error
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    urls: list[str] = []
    scrapes: list[dict[tuple[str, str], float]] = []

    def scrape() -> dict[tuple[str, str], float]:
        with urllib.request.urlopen(urls[0], timeout=10) as response:
            families = text_string_to_metric_families(response.read().decode())
        return {
            (s.name, s.labels["engine"]): s.value
            for f in families
            for s in f.samples
            if "engine" in s.labels
            and set(s.labels) <= {"engine", "model_name", "onboarding"}
            and s.labels.get("onboarding", "false") == "false"
        }

    original = engine_command._generate

    def generate(*args: Any) -> None:
        original(*args)
        if not urls:
            urls.append(capsys.readouterr().err.split()[1])  # "metrics: URL", before anything else
        scrapes.append(scrape())

    monkeypatch.setattr(engine_command, "_generate", generate)
    flags = ["--model", "llama", "--backend", backend.name, "--limit", "6", "--max-running", "2", "--check"]
    code, out, err = run(capsys, *flags, "--max-new-tokens", "2", "--metrics-port", "0", "--json", *QUIET)
    assert code == 0, err
    result = json.loads(out)
    last = scrapes[-1]
    assert result["waves"] >= 2 and len(scrapes) == 2 * result["waves"]  # each wave on both engines
    assert last["vllm:prefix_cache_hits_total", "0"] == result["reused_tokens"] > 0
    assert last["vllm:prefix_cache_hits_total", "check"] == 0
    assert last["kvcore_requests_total", "0"] == last["kvcore_requests_total", "check"] == 6
    assert last["kvcore_resume_seconds_count", "0"] >= 6
    assert urls[0].startswith("http://127.0.0.1:")
    with pytest.raises(urllib.error.URLError):
        scrape()
