"""Every error of the `kvcore` command is one line naming what the user typed, exit status 2,
no traceback, and nothing replayed: bad flags, corrupted trace lines, bad environment."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import kv_api
from kv_replay import replay_command
from kv_replay.cli import main, parser
from kv_replay.model import SSM, ModelError, model_config, parse_layers
from kv_replay.plot import PlotError

FAST = ["--quiet", "--layers", "1", "--tokens-per-block", "4", "--bytes-per-token", "64"]
GOOD = {"tokens": [5, 6, 7, 8, 9, 10], "output": [1, 2], "cache_salt": "a", "timestamp": 1}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, out: str, err: str, names: str) -> None:
    assert code == 2
    assert out == ""  # nothing replayed, nothing printed
    assert err.count("\n") == 1 and err.startswith(f"kvcore: error: {names}"), err
    assert "Traceback" not in err


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("trace") / "trace.jsonl"
    path.write_text("\n".join(json.dumps({**GOOD, "timestamp": i}) for i in range(3)) + "\n")
    return path


def refused_layers(spec: str) -> bool:
    try:
        parse_layers(spec)
    except ModelError:
        return True
    return False


# Values each flag refuses, whatever else is on the command line.
BAD_VALUES: dict[str, Any] = {
    "--tokens-per-block": st.one_of(st.integers(max_value=0), st.integers(min_value=4097)),
    "--bytes-per-token": st.one_of(st.integers(max_value=0), st.integers(min_value=(1 << 20) + 1)),
    "--max-in-flight": st.one_of(st.integers(max_value=0), st.integers(min_value=(1 << 16) + 1)),
    "--seed": st.one_of(st.integers(max_value=-1), st.integers(min_value=2**64)),
    "--limit": st.one_of(st.integers(max_value=0), st.integers(min_value=(1 << 24) + 1)),
    "--quota": st.one_of(
        st.just("0"),
        st.integers(min_value=2**63).map(str),
        st.sampled_from(["1X", "-1G", "1.5", "G", "1G,", ",", "1..5G", "0.1B", "1e9", " "]),
    ),
    "--host-quota": st.one_of(
        st.just("0"),
        st.integers(min_value=2**63).map(str),
        st.sampled_from(["1X", "-1G", "1.5", "G", "1G,", ",", "1..5G", "0.1B", "1e9", " "]),
    ),
    "--disk-quota": st.one_of(
        st.just("0"),
        st.integers(min_value=2**63).map(str),
        st.sampled_from(["1X", "-1G", "1.5", "G", "1G,", ",", "1G,2G", "0.1B", "1e9", " "]),
    ),
    "--layers": st.one_of(
        st.sampled_from(["", "0", "4x", "4x0", "x4", "4+2", "4x8+", "2000", "1,", "-1", "4x8x8", "1x99999999999999"]),
        st.text(alphabet="0123456789x+,- ab", min_size=1).filter(refused_layers),
    ),
}


@given(
    flag=st.sampled_from(sorted(BAD_VALUES)),
    data=st.data(),
    text=st.booleans(),
)
def test_a_bad_flag_value_is_one_line_naming_the_flag(
    capsys: pytest.CaptureFixture[str], trace: Path, flag: str, data: st.DataObject, text: bool
) -> None:
    value = str(data.draw(BAD_VALUES[flag]))
    if text and flag != "--layers":  # words, floats, empty: not numbers at all
        value = data.draw(st.sampled_from(["", "x", "1.5", "0x10", "1_000x", "\x00", "ten"]))
    code, out, err = run(capsys, "replay", str(trace), *FAST, f"{flag}={value}")
    assert_one_line_error(code, out, err, f"{flag}: ")


@given(noise=st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=4))
def test_unknown_flags_and_words_are_one_line(
    capsys: pytest.CaptureFixture[str], trace: Path, noise: list[str]
) -> None:
    argv = ["replay", str(trace), *FAST, "--no-such-flag", *noise]
    code, out, err = run(capsys, *argv)
    assert_one_line_error(code, out, err, "")


def corrupt(line: bytes, at: int, cut: int, insert: bytes) -> bytes:
    at %= len(line) + 1
    return line[:at] + insert + line[at + cut :]


@given(at=st.integers(0, 200), cut=st.integers(0, 8), insert=st.binary(max_size=8), line=st.integers(0, 2))
def test_a_corrupted_line_is_named_or_replays(
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
    at: int,
    cut: int,
    insert: bytes,
    line: int,
) -> None:
    lines = [json.dumps({**GOOD, "timestamp": i}).encode() for i in range(3)]
    lines[line] = corrupt(lines[line], at, cut, insert)
    path = tmp_path_factory.mktemp("corrupt") / "trace.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    code, out, err = run(capsys, "replay", str(path), *FAST, "--json")
    if code == 0:  # the corruption left a valid request (e.g. inside a salt string)
        assert json.loads(out)["requests"] in (2, 3) and err == ""
        return
    # A corruption can split the line in two (an inserted newline): it names the line it broke.
    assert_one_line_error(code, out, err, f"{path}:")


# JSON values of every type a field might wrongly hold: beyond a float, negative, NaN-like words,
# lone surrogates, nested deeper than the parser goes.
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.integers(min_value=2**1030, max_value=10**400),  # no float holds these
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(st.characters(codec=None), max_size=8),  # lone surrogates too (written as \\udXXX)
)
_VALUES = st.recursive(
    _SCALARS, lambda v: st.lists(v, max_size=3) | st.dictionaries(st.text(max_size=4), v, max_size=3)
)
_FIELDS = [
    "tokens",
    "output",
    "output_length",
    "input_length",
    "hash_ids",
    "timestamp",
    "cache_salt",
    "lora_id",
    "name",
]
_WORDS = st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-0", "01", "1" + "0" * 5000, "tru", ""])


@st.composite
def garbled_lines(draw: st.DrawFn) -> bytes:
    """A trace line broken one way: a field of the wrong type or range, a word JSON refuses,
    deep nesting, a cut, or raw bytes."""
    record = (
        dict(GOOD)
        if draw(st.booleans())
        else {"timestamp": 1, "input_length": 600, "output_length": 2, "hash_ids": [1, 2]}
    )
    how = draw(st.sampled_from(["field", "word", "deep", "cut", "bytes"]))
    key = draw(st.sampled_from(_FIELDS))
    if how == "field":
        record[key] = draw(_VALUES)
    text = json.dumps(record)
    if how == "word":
        text = text.replace("}", f', "{key}": {draw(_WORDS)}}}')
    elif how == "deep":
        depth = draw(st.integers(1, 200_000))
        text = text.replace("}", f', "{key}": {"[" * depth}{"]" * depth}}}')
    line = text.encode("utf-8", "surrogatepass")  # a lone surrogate as its (invalid) bytes
    if how == "cut":
        line = line[: draw(st.integers(0, len(line)))]
    elif how == "bytes":
        line = draw(st.binary(min_size=1, max_size=40))
    return line


@given(line=garbled_lines(), last=st.booleans())
def test_a_garbled_line_is_named_or_replays(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str], line: bytes, last: bool
) -> None:
    """Whatever a line holds, the command replays or says FILE:LINE: why, with status 2: never a
    traceback. ``last``: the line ends the file without a newline (a truncated file)."""
    good = json.dumps(GOOD).encode()
    path = tmp_path_factory.mktemp("garbled") / "trace.jsonl"
    path.write_bytes(good + b"\n" + line + (b"" if last else b"\n" + good + b"\n"))
    code, out, err = run(capsys, "replay", str(path), *FAST, "--json")
    if code == 0:  # the line was still a request, or blank (then, last, only the good line before it)
        assert json.loads(out)["requests"] >= (1 if last else 2) and err == ""
        return
    assert_one_line_error(code, out, err, f"{path}:")
    assert re.match(rf"kvcore: error: {re.escape(str(path))}:\d+: \S", err), err


def test_output_paths_are_checked_before_the_replay(capsys: pytest.CaptureFixture[str], trace: Path) -> None:
    code, out, err = run(capsys, "replay", str(trace), *FAST, "--plot", "/nonexistent/dir/x.png")
    assert_one_line_error(code, out, err, "--plot: ")


def test_a_plot_that_fails_after_the_replay_leaves_the_summary(
    capsys: pytest.CaptureFixture[str], trace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("matplotlib")

    def broken(*args: Any, **kwargs: Any) -> None:
        raise PlotError("--plot: cannot save: disk full")

    monkeypatch.setattr(replay_command, "plot_replay", broken)
    code, out, err = run(capsys, "replay", str(trace), *FAST, "--plot", str(tmp_path / "x.png"))
    assert code == 2 and "hit rate" in out
    assert err == "kvcore: error: --plot: cannot save: disk full\n"


def test_limit_reads_only_the_lines_it_replays(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n" + json.dumps(GOOD) + "\n{broken\n")
    code, out, err = run(capsys, "replay", str(path), *FAST, "--limit", "2", "--json")
    assert code == 0, err
    assert json.loads(out)["requests"] == 2
    code, out, err = run(capsys, "replay", str(path), *FAST, "--limit", "3")
    assert_one_line_error(code, out, err, f"{path}:4: not valid JSON")


@pytest.mark.parametrize(
    "hash_ids", [[1, True], [1, -1], [2**64, 1], [1, 2.0], [1, "2"], [1, None], [1, [2]]], ids=repr
)
def test_a_bad_block_id_is_named(capsys: pytest.CaptureFixture[str], tmp_path: Path, hash_ids: list[object]) -> None:
    """Each id is checked (the list's types in one pass, then its bounds): the first bad one
    anywhere in the list fails the line."""
    path = tmp_path / "trace.jsonl"
    path.write_text(json.dumps({"timestamp": 1, "input_length": 600, "output_length": 2, "hash_ids": hash_ids}))
    code, out, err = run(capsys, "replay", str(path), *FAST)
    assert_one_line_error(code, out, err, f"{path}:1: field 'hash_ids': must be a list of integers in [0, 2**64)")


def test_a_binary_trace_is_named_with_its_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_bytes(json.dumps(GOOD).encode() + b"\n\x89PNG\r\n\x1a\n\x00\xff\n")
    code, out, err = run(capsys, "replay", str(path), *FAST)
    assert_one_line_error(code, out, err, f"{path}:2: not UTF-8 text")


def test_a_bad_backend_names_where_it_came_from(
    capsys: pytest.CaptureFixture[str], trace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = run(capsys, "replay", str(trace), *FAST, "--backend", "bogus")
    assert_one_line_error(code, out, err, "--backend: unknown backend 'bogus'")
    monkeypatch.setenv("KV_BACKEND", "bogus")
    code, out, err = run(capsys, "replay", str(trace), *FAST)
    assert_one_line_error(code, out, err, "KV_BACKEND: unknown backend 'bogus'")
    code, out, err = run(capsys, "backends")
    assert code == 2 and err.startswith("kvcore: error: KV_BACKEND: unknown backend 'bogus'") and err.count("\n") == 1
    assert "default backend" not in out


def test_a_quota_beyond_the_address_space_names_the_quota(
    capsys: pytest.CaptureFixture[str], trace: Path, backend: kv_api.Backend
) -> None:
    code, out, err = run(capsys, "replay", str(trace), *FAST, "--backend", backend.name, "--quota", "1P")
    assert_one_line_error(code, out, err, "--quota 1P: cannot map ")


def test_help_shows_every_default() -> None:
    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    options = [a for a in sub.choices["replay"]._actions if a.option_strings and a.nargs != 0]
    assert len(options) >= 9
    for action in options:  # every option that takes a value says what it is without one
        assert "(default: " in (action.help or ""), action.option_strings


def test_a_closed_stdout_ends_quietly(trace: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    p = subprocess.Popen(
        [sys.executable, "-m", "kv_replay.cli", "replay", str(trace), *FAST, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()  # like `| head -0`: the first write fails
    err = p.stderr.read()
    assert p.wait() == 141
    assert err == b""


def test_ssm_layer_groups() -> None:
    assert parse_layers("2, 3ssm,1x64") == [(2, None, None), (3, SSM, None), (1, 64, None)]
    for bad in ("0ssm", "ssm", "2ssmx", "2xssm", "2ssm+1"):
        assert refused_layers(bad), bad
    config = model_config("1,2ssm", 4, 1 << 20, 64)
    assert config.commit_min_snapshot
    assert [type(layer).__name__ for layer in config.layers] == ["AttentionLayerConfig"] + ["SsmLayerConfig"] * 2
    assert not model_config("1,1x8", 4, 1 << 20, 64).commit_min_snapshot
