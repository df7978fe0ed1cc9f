"""The README's Python example runs as printed, on every backend, and prints what the README
says; the docs point at nothing outside the repository."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import kv_api

ROOT = Path(__file__).resolve().parents[3]


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.DOTALL)


def test_the_readme_example_runs_and_prints_what_it_says(backend: kv_api.Backend) -> None:
    readme = (ROOT / "README.md").read_text()
    (example,) = blocks(readme, "python")
    (expected,) = blocks(readme, "text")
    env = {**os.environ, "KV_BACKEND": backend.name}
    out = subprocess.run([sys.executable, "-c", example], env=env, capture_output=True, text=True, check=True).stdout
    assert out == expected
    assert "100 reused" in out


def test_docs_point_at_nothing_outside_the_repository() -> None:
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        assert "../shared" not in doc.read_text() and "shared/traces" not in doc.read_text(), doc.name
