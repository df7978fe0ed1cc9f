"""The repository as these tests see it: its files, copied where a test may build and litter."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def source_files() -> list[str]:
    """The repository's files as a clean clone has them: tracked, plus new files not ignored."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return sorted(f for f in listed.split("\0") if f and (ROOT / f).is_file())


def copy_repository(dest: Path, leave_out: tuple[str, ...] = ()) -> Path:
    """A copy of the repository's files at ``dest``, without the folders in ``leave_out``."""
    for name in source_files():
        if name.startswith(leave_out):
            continue
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    return dest


def blocks(text: str, language: str) -> list[str]:
    """The fenced code blocks of ``language`` in a Markdown text, in order."""
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.DOTALL)


def fresh_venv(where: Path) -> dict[str, str]:
    """A new virtual environment with nothing of kvcore in it, and the environment variables that
    make ``python`` and installed commands its own: a user's shell after activating it."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KV_", "PYTHON", "VIRTUAL_ENV", "NOX"))}
    env["VIRTUAL_ENV"] = str(where)
    env["PATH"] = f"{where / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def run_block(block: str, cwd: Path, env: dict[str, str], timeout: float) -> str:
    """Runs a shell block as a user would paste it (stopping at the first failing command);
    returns its output, and fails naming the block and the output when a command fails."""
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"this block failed (exit {done.returncode}):\n{block}\n--- output ---\n{out[-6000:]}"
    return out
