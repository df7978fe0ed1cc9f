"""The `kvcore` command: traces, malformed input, JSON schema, comparison, plots."""

from __future__ import annotations

import gzip
import json
import re
import sys
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest

import kv_api
from kv_replay import trace as trace_module
from kv_replay.cli import main
from kv_replay.report import COMPARE_SCHEMA, SUMMARY_SCHEMA
from kv_replay.synthetic import synthetic_runs
from kv_replay.trace import MOONCAKE_BLOCK, load_trace, synthetic_tokens

SMALL = ["--quiet", "--layers", "2", "--quota", "16M", "--tokens-per-block", "16"]


def write(tmp_path: Path, lines: list[Any], name: str = "trace.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return path


def mooncake(tmp_path: Path) -> Path:
    return write(
        tmp_path,
        [
            {"timestamp": 0, "input_length": 1000, "output_length": 4, "hash_ids": [0, 1]},
            {"timestamp": 5, "input_length": 1500, "output_length": 3, "hash_ids": [0, 1, 2]},
            {"timestamp": 9, "input_length": 300, "output_length": 2, "hash_ids": [7]},
        ],
    )


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_mooncake_blocks_are_shared_by_hash_id(tmp_path: Path) -> None:
    a, b, c = load_trace(mooncake(tmp_path))
    assert len(a.prompt) == 1000 and len(b.prompt) == 1500 and len(c.prompt) == 300
    assert (b.prompt[: MOONCAKE_BLOCK * 2] == load_trace(mooncake(tmp_path))[1].prompt[: MOONCAKE_BLOCK * 2]).all()
    assert (a.prompt[:1000] == b.prompt[:1000]).all()  # same hash ids, same tokens
    assert not (c.prompt[:300] == a.prompt[:300]).all()
    assert len(a.output) == 4


def test_replay_json_follows_the_schema(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], backend: kv_api.Backend
) -> None:
    code, out, err = run(capsys, "replay", str(mooncake(tmp_path)), "--backend", backend.name, "--json", *SMALL)
    assert code == 0, err
    summary = json.loads(out)
    jsonschema.validate(summary, SUMMARY_SCHEMA)
    assert summary["backend"] == backend.name and summary["requests"] == 3
    # The second request reuses the first's two blocks: 1000 tokens minus the partial tail.
    assert summary["reused_tokens"] >= 1000 - 1000 % 16
    assert summary["prompt_tokens"] == 2800


def test_kvcore_trace_with_explicit_tokens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], backend: kv_api.Backend
) -> None:
    shared = list(range(100, 164))
    trace = write(
        tmp_path,
        [
            {"tokens": [*shared, 1, 2, 3], "output": [9, 9], "cache_salt": "a"},
            {"tokens": [*shared, 1, 2, 7], "output_length": 3, "cache_salt": "a"},
            {"tokens": [*shared, 1, 2, 7], "output_length": 3, "cache_salt": "b"},  # another tenant: no reuse
        ],
    )
    code, out, err = run(
        capsys, "replay", str(trace), "--backend", backend.name, "--json", *SMALL, "--max-in-flight", "1"
    )
    assert code == 0, err
    # The shared blocks, then [1, 2] of the first request's partial tail block [1, 2, 3, 9, 9].
    assert json.loads(out)["reused_tokens"] == 64 + 2


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"input_length": 10, "output_length": 1}', "expected a field 'hash_ids' (Mooncake) or 'tokens' (kvcore)"),
        (
            '{"input_length": 600, "output_length": 1, "hash_ids": [1]}',
            "field 'input_length': 600 tokens exceed its 1 block ('hash_ids') of 512 tokens",
        ),
        (
            '{"input_length": 0, "output_length": 1, "hash_ids": [1]}',
            "field 'input_length': must be an integer in [1, ",
        ),
        (
            '{"input_length": 10, "output_length": -1, "hash_ids": [1]}',
            "field 'output_length': must be an integer in [0, ",
        ),
        (
            '{"input_length": 10, "output_length": 99999999999999999999, "hash_ids": [1]}',
            "field 'output_length': must be an integer in [0, 16,777,216] (got 99999999999999999999)",
        ),
        ('{"input_length": 10, "output_length": 1, "hash_ids": [1, "x"]}', "field 'hash_ids': must be a list"),
        ('{"tokens": [1, -2], "output_length": 1}', "field 'tokens': must be a list of token ids"),
        ('{"tokens": [], "output_length": 1}', "field 'tokens': must not be empty"),
        ('{"tokens": [1], "output_length": 1, "cache_salt": 3}', "field 'cache_salt': must be a string (got 3)"),
        ('{"tokens": [1], "output_length": 1, "timestamp": "x"}', "field 'timestamp': must be a finite number"),
        ('{"tokens": [1], "output_length": 1, "timestamp": NaN}', "not valid JSON (NaN is not a JSON number)"),
        ('{"tokens": [1], "output_length": 1, "timestamp": 1e999}', "field 'timestamp': must be a finite number"),
        ('{"tokens": [1], "output_length": 1e3}', "field 'output_length': must be an integer"),
        ('{"tokens": [1], "output_length": 1, "name": "\udcff"}', "not UTF-8 text"),
        # An integer no float holds, nesting deeper than the parser goes: once tracebacks.
        ('{"tokens": [1], "output_length": 1, "timestamp": 1' + "0" * 400 + "}", "field 'timestamp': must be a finite"),
        ('{"tokens": [1], "output_length": 1, "x": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
        ('{"tokens": [1], "output_length": ' + "[" * 500 + "]" * 500 + "}", "field 'output_length': must be an"),
        (
            '{"tokens": [1], "output_length": 1' + "0" * 5000 + "}",
            "not valid JSON (an integer of more than 4,300 digits)",
        ),
        ('{"tokens": [1], "output_length": 1, "cache_salt": "\\udcff"}', "field 'cache_salt': not Unicode text"),
        ('{"tokens": [1], "output_length": 1, "name": {"a": [1]}}', "field 'name': must be a string (got {"),
        ('{"tokens": [1], "output_length": 1, "timestamp": true}', "field 'timestamp': must be a finite number"),
        ('{"tokens": [1], "output_length": 1, "lora_id": -1}', "field 'lora_id': must be an unsigned 64-bit"),
        ('{"tokens": [1], "output_length": 1, "timestamp": Infinity}', "not valid JSON (Infinity is not a JSON"),
        ('\ufeff{"tokens": [1], "output_length": 1}', "a byte order mark (U+FEFF) past the first line"),
    ],
)
def test_malformed_line_is_named_and_nothing_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, message: str
) -> None:
    good = json.dumps({"tokens": [1, 2, 3], "output_length": 1})
    trace = tmp_path / "trace.jsonl"
    trace.write_bytes(b"\n".join([good.encode(), b"", line.encode("utf-8", "surrogateescape"), good.encode()]) + b"\n")
    code, out, err = run(capsys, "replay", str(trace), *SMALL)
    assert code == 2
    assert out == ""  # no summary: the replay never started
    assert err.startswith(f"kvcore: error: {trace}:3: ") and message in err


def test_missing_and_empty_traces(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "replay", str(tmp_path / "nope.jsonl"), *SMALL)
    assert code == 2 and out == "" and "No such file" in err
    code, out, err = run(capsys, "replay", "mooncake", *SMALL)  # a misspelt built-in trace
    assert (code, out) == (2, "")
    # It names the built-in traces, so that the misspelling shows.
    builtin = "nor a built-in trace (built-in traces: mooncake-synthetic)"
    assert err == f"kvcore: error: mooncake: No such file or directory, {builtin}\n"
    code, out, err = run(capsys, "replay", "", *SMALL)  # not the embedded workload
    assert (code, out) == (2, "") and err.startswith("kvcore: error: '': No such file")
    code, out, err = run(capsys, "replay", str(tmp_path), *SMALL)
    assert (code, out, err) == (2, "", f"kvcore: error: {tmp_path}: Is a directory\n")
    code, out, err = run(capsys, "replay", str(write(tmp_path, [""], "empty.jsonl")), *SMALL)
    assert code == 2 and out == "" and "no requests" in err


def test_a_truncated_last_line_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = json.dumps({"tokens": [1, 2, 3], "output_length": 1})
    trace = tmp_path / "trace.jsonl"
    trace.write_text(f"{good}\n{good}\n{good[:-9]}")  # no newline: the file was cut
    code, out, err = run(capsys, "replay", str(trace), *SMALL)
    assert (code, out) == (2, "") and err.startswith(f"kvcore: error: {trace}:3: not valid JSON"), err


def test_a_byte_order_mark_starting_the_file_is_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_bytes(b"\xef\xbb\xbf" + json.dumps({"tokens": [1, 2, 3], "output_length": 1}).encode() + b"\n")
    code, out, err = run(capsys, "replay", str(trace), *SMALL, "--json")
    assert code == 0 and json.loads(out)["requests"] == 1, err


def test_a_corrupt_gzip_trace_is_named_with_its_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = b"".join(json.dumps({"tokens": [i], "output_length": 1}).encode() + b"\n" for i in range(500))
    whole = gzip.compress(text, mtime=0)
    data = bytearray(whole)
    data[40] ^= 0xFF  # the deflate stream's code tables: zlib.error, once a traceback
    data[60] ^= 0xFF
    trace = tmp_path / "trace.jsonl.gz"
    for broken, why in ((data, "corrupt gzip data"), (whole[: len(whole) // 3], "Compressed file ended")):
        trace.write_bytes(bytes(broken))
        code, out, err = run(capsys, "replay", str(trace), *SMALL)
        assert (code, out) == (2, "") and re.match(rf"kvcore: error: {re.escape(str(trace))}:\d+: cannot read: ", err)
        assert why in err, err


def test_a_mooncake_line_expands_only_the_blocks_it_keeps(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # A long hash_ids list and a short input_length: expanding every id (512 tokens each) could
    # take gigabytes before the cut. Each distinct id is expanded once, whichever lines name it.
    made: list[list[int]] = []

    def recording(seeds: Any, lengths: Any, stream: int = 0) -> Any:
        made.append(seeds.tolist())
        return synthetic_runs(seeds, lengths, stream)

    monkeypatch.setattr(trace_module, "synthetic_runs", recording)
    path = tmp_path / "long.jsonl"
    lines = [
        {"hash_ids": list(range(100_000)), "input_length": 600, "output_length": 2},
        {"hash_ids": [1, 0, 7], "input_length": 1100, "output_length": 0},
        {"hash_ids": [7, 8], "input_length": 1024, "output_length": 3},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    first, second, third = load_trace(path)
    assert made[0] == [0, 1, 7, 8]  # the blocks, then the outputs
    assert [len(r.prompt) for r in (first, second, third)] == [600, 1100, 1024]
    block = {h: synthetic_tokens(h, MOONCAKE_BLOCK, stream=1) for h in (0, 1, 7, 8)}
    assert (first.prompt[:512] == block[0]).all() and (first.prompt[512:] == block[1][:88]).all()
    assert (second.prompt == np.concatenate([block[1], block[0], block[7][:76]])).all()
    assert (third.prompt == np.concatenate([block[7], block[8]])).all()
    assert [r.output.tolist() for r in (first, second, third)] == [
        synthetic_tokens(i, n, stream=2).tolist() for i, n in ((0, 2), (1, 0), (2, 3))
    ]


def test_a_gathered_prompt_is_made_when_read(tmp_path: Path) -> None:
    # A prompt whose blocks are not consecutive rows of the trace's table is gathered on every
    # read (kv_replay.request): a fresh array each time, the same tokens; its length and head
    # come without a gather, and agree with it wherever the head ends.
    path = tmp_path / "gathered.jsonl"
    lines = [
        {"hash_ids": [0, 1, 2], "input_length": 1500, "output_length": 1},
        {"hash_ids": [2, 0, 1, 3], "input_length": 1800, "output_length": 1},
        {"hash_ids": [1], "input_length": 20, "output_length": 1},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    requests = load_trace(path)
    gathered = requests[1]
    once, again = gathered.prompt, gathered.prompt
    assert once is not again and (once == again).all()
    assert not np.shares_memory(once, requests[0].prompt)  # not a view of the table
    for request in requests:
        prompt = request.prompt
        assert request.prompt_length == len(prompt)
        for n in (0, 1, 32, 511, 512, 513, 1024, 1700, 5000):
            assert (request.prompt_head(n) == prompt[:n]).all() and len(request.prompt_head(n)) == min(n, len(prompt))


def test_bad_options_fail_cleanly(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "replay", "--layers", "4x", "--quiet")
    assert code == 2 and "--layers" in err and out == ""
    code, out, err = run(capsys, "replay", "--backend", "nope", "--quiet")
    assert code == 2 and "unknown backend 'nope'" in err and out == ""
    code, out, err = run(capsys, "replay", "--quota", "lots")
    assert (code, out, err) == (2, "", "kvcore: error: --quota: not a size: 'lots' (e.g. 268435456, 256M, 1G, 1.5T)\n")


def test_compare_agrees_and_reports_ratios(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "replay", str(mooncake(tmp_path)), "--compare", "--json", *SMALL)
    assert code == 0, err
    report = json.loads(out)
    jsonschema.validate(report, COMPARE_SCHEMA)
    assert report["reuse_identical"] is True
    assert [s["backend"] for s in report["backends"]] == list(kv_api.available_backends())
    assert min(report["speed_ratio"].values()) == 1.0
    code, out, err = run(capsys, "replay", str(mooncake(tmp_path)), "--compare", *SMALL)
    assert code == 0 and "reuse identical on every backend" in out and "hit rate" in out


def test_default_workload_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "replay", "--quiet", "--limit", "40")
    assert code == 0, err
    for row in (
        "requests",
        "prompt tokens",
        "reused tokens",
        "hit rate",
        "evictions",
        "peak pool utilisation",
        "admission latency p50",
        "admission latency p99",
        "tokens hashed per second",
    ):
        assert row in out
    assert err == ""  # no progress bar when stderr is not a terminal


def test_plot_writes_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "replay.png"
    code, _, err = run(capsys, "replay", "--quiet", "--limit", "20", "--plot", str(path))
    assert code == 0, err
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert err == f"kvcore: wrote the plot to {path}\n"  # where, as an absolute path (on stderr: stdout may be JSON)


def test_plot_without_matplotlib_says_how(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
    code, _, err = run(capsys, "replay", "--quiet", "--limit", "5", "--plot", str(tmp_path / "x.png"))
    assert code == 2 and "pip install" in err and "matplotlib" in err


def test_backends_lists_every_backend(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "backends")
    assert code == 0
    for name in kv_api.available_backends():
        assert f"\n{name} " in out
    assert f"default backend: {kv_api.default_backend_name()}" in out


def test_version_names_the_command_the_contract_and_every_backend(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    found = ", ".join(f"{n} {kv_api.load_backend(n).version}" for n in kv_api.available_backends())
    assert re.fullmatch(rf"kvcore \d+\.\d+\.\d+\S* \(kv-api \d+\.\d+\.\d+\S*; backends: {re.escape(found)}\)\n", out)
