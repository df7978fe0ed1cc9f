"""docs/adding-a-backend.md, followed as written: its shell blocks, in order, run in a fresh virtual
environment on a copy of the repository (without the native backend, which they never need),
with ``examples/kv-delegate`` becoming the new backend ``mini``. A step that no longer works
fails here, with the block and its output."""

from __future__ import annotations

import re
from pathlib import Path

from _repository import ROOT, blocks, copy_repository, fresh_venv, run_block

NAME = "mini"
DOC = ROOT / "docs/adding-a-backend.md"


def doc_commands() -> list[str]:
    return [b.replace("<name>", NAME) for b in blocks(DOC.read_text(), "bash")]


def passed(out: str) -> int:
    """How many tests pytest's last summary line says passed (0 if none)."""
    counts = re.findall(r"(\d+) passed", out)
    return int(counts[-1]) if counts else 0


def test_the_docs_commands_add_a_backend_that_passes_the_suite(tmp_path: Path) -> None:
    repo = copy_repository(tmp_path / "kvcore", leave_out=("packages/kv-core-cpp/",))
    env = fresh_venv(tmp_path / "venv")
    env["KV_DIFFERENTIAL_EXAMPLES"] = "200"  # the lock-step machine's share of this test's time
    commands = doc_commands()
    assert len(commands) == 4, "the test's expectations below follow the page's four blocks"
    create, suite, side_by_side, under_nox = commands
    run_block(create, repo, env, timeout=60)
    backend = repo / f"packages/kv-{NAME}"
    assert (backend / f"src/kv_{NAME}/__init__.py").is_file()
    assert f'{NAME} = "kv_{NAME}"' in (backend / "pyproject.toml").read_text()

    out = run_block(suite, repo, env, timeout=900)
    assert f"kv backend {NAME} 0.1.0" in out and "kv backend py" not in out
    assert passed(out) > 500, out[-3000:]

    out = run_block(side_by_side, repo, env, timeout=900)
    assert f"kv backend {NAME} 0.1.0" in out and "kv backend py 0.1.0" in out
    assert passed(out) > 0, out[-3000:]

    # The suite ran above: under nox, collecting it shows which backends the session tests.
    out = run_block(under_nox, repo, {**env, "PYTEST_ADDOPTS": "--collect-only"}, timeout=900)
    # The noxfile found the new folder by its entry point and tests that backend alone.
    (found,) = re.findall(r"testing KV_BACKEND=(\S+) \(in this repository: (.*)\)", out)
    assert found[0] == NAME and sorted(found[1].split(", ")) == sorted([NAME, "py"])
    assert f"kv backend {NAME} 0.1.0" in out and "kv backend py 0.1.0" not in out
    assert len(re.findall(r"(\d+) tests? collected", out)) == 2, out[-3000:]  # the suite, the replayer's
