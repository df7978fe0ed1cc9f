"""``kvcore engine`` where ``kv_engine`` (torch, transformers) is not installed, as in this
package's own test environment: its help and its flag errors work without them, and running it
says in one line what to install. (Its runs are tested in packages/kv-engine/tests.)"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys

import pytest

from kv_replay.cli import main, parser


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["engine", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_missing_kv_engine_is_one_line_saying_what_to_install(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "kv_engine", None)  # import kv_engine raises ImportError
    code, out, err = run(capsys, "--model", "llama", "--quiet")
    assert code == 2 and out == ""
    assert err == (
        "kvcore: error: engine: kv_engine is not installed (pip install ./packages/kv-engine; "
        "docs/engine.md says how to get a CPU-only torch)\n"
    )


def test_a_missing_torch_is_named(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    if importlib.util.find_spec("kv_engine") is None:
        pytest.skip("kv_engine is not installed: the test above covers it")
    for name in [m for m in sys.modules if m == "kv_engine" or m.startswith("kv_engine.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torch", None)
    code, out, err = run(capsys, "--model", "llama", "--quiet")
    assert code == 2 and out == ""
    assert err.startswith("kvcore: error: engine: torch is not installed (pip install ./packages/kv-engine")


def test_help_and_flags_need_no_torch() -> None:
    """``kvcore engine --help`` and a bad flag never import torch (nor transformers)."""
    code = (
        "import sys; from kv_replay.cli import main\n"
        "for argv in (['engine', '--help'], ['engine', '--model', 'llama', '--limit', '0']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules and 'kv_engine' not in sys.modules\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "Token ids are taken modulo the model's vocabulary size" in " ".join(p.stdout.split())
    assert p.stderr == "kvcore: error: --limit: must be in [1, 16,777,216] (got 0)\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "the following arguments are required: --model"),
        (["--model", "gpt-9"], "--model: 'gpt-9' is neither a built-in model (llama, qwen2, "),
        (["--model", "llama", "--limit", "-1"], "--limit: must be in [1, "),
        (["--model", "llama", "--host-quota", "1G,2G"], "--host-quota: one size, not a list (got '1G,2G')"),
        (["--model", "llama", "--device-quota", "0"], "--device-quota: '0' must be at least 1 byte"),
        (["--model", "llama", "--tokens-per-block", "0"], "--tokens-per-block: must be in [1, 4,096]"),
        (["--model", "llama", "--quiet", "--progress"], "--progress: not with --quiet"),
    ],
)
def test_bad_flags_are_one_line_naming_the_flag(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"kvcore: error: {message}"), err


def test_help_shows_every_default() -> None:
    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    options = [a for a in sub.choices["engine"]._actions if a.option_strings and a.nargs != 0]
    assert len(options) >= 14
    for action in options:  # every option that takes a value says what it is without one
        assert "(default: " in (action.help or "") or "(required)" in (action.help or ""), action.option_strings
