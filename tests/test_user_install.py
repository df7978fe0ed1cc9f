"""The README's install, as a user runs it: its ``pip install ./packages/kvcore`` block in a fresh
virtual environment on a copy of the repository, then the README's Python example in that
environment prints what the README says, on each backend the install brought."""

from __future__ import annotations

import subprocess
from pathlib import Path

from _repository import ROOT, blocks, copy_repository, fresh_venv, run_block


def test_one_install_gives_the_library_both_backends_and_the_command(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    (install,) = [b for b in blocks(readme, "bash") if "./packages/kvcore" in b]
    (example,) = blocks(readme, "python")
    (expected,) = blocks(readme, "text")
    repo = copy_repository(tmp_path / "kvcore")
    env = fresh_venv(tmp_path / "venv")
    out = run_block(install, repo, env, timeout=1500)
    assert "kvcore 0.1.0" in out and "hit rate" in out
    python = str(tmp_path / "venv/bin/python")
    listed = subprocess.run(
        [python, "-c", "import kv_api; print(','.join(kv_api.available_backends()))"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert listed == ["cpp,py"]
    for backend in ("cpp", "py"):
        done = subprocess.run(
            [python, "-c", example], cwd=tmp_path, env={**env, "KV_BACKEND": backend}, capture_output=True, text=True
        )
        assert done.returncode == 0 and done.stdout == expected, done.stderr
