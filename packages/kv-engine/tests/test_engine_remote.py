"""Reuse through the remote tier (docs/store.md): one engine computes a prefix and writes its
blocks through to a store; another engine, with a manager of its own (as another instance of a
fleet would be), finds them there, and its outputs are still exactly ``generate``'s (float64).
A process restarting on a directory store (``kvcore engine --remote file:DIR``) does the same
across processes. A store under another model id is never read.

Mutation checked once (the Python backend, edited and restored): fetched pages copied from the
previous value's bytes fail the first test (every check passed, the bytes are the wrong block's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from engine_reference import check, model, tokens

import kv_api
import kv_engine

pytestmark = pytest.mark.requires("remote_tier")

SYSTEM = tokens(11, 48)  # 3 blocks


def engine(backend: kv_api.Backend, store: kv_api.BlockStore, model_id: str = "tiny-llama") -> kv_engine.Engine:
    remote = kv_api.RemoteCacheTierConfig(store, model_id, "float64")
    return kv_engine.Engine(model("llama"), backend=backend, keep_logits=True, remote=remote)


def test_another_engine_reuses_the_prefix_through_the_store(backend: kv_api.Backend) -> None:
    store = kv_api.MemoryBlockStore()
    first = engine(backend, store)
    [a] = first.generate([SYSTEM + tokens(12, 5)], max_new_tokens=3)
    assert a.reused_tokens == 0
    assert first.manager.get_committed_stats().remote_written >= 3
    first.close()

    second = engine(backend, store)
    prompt = SYSTEM + tokens(13, 9)
    [b] = second.generate([prompt], max_new_tokens=6)
    assert b.reused_tokens == 48 and b.reused_by_level == (0, 48)
    check("llama", prompt, b)
    assert second.manager.get_committed_stats().remote_blocks == 3

    other = engine(backend, store, model_id="another-model")
    [c] = other.generate([prompt], max_new_tokens=1)
    assert c.reused_tokens == 0


def test_a_restarted_process_reuses_yesterdays_prefixes(backend: kv_api.Backend, tmp_path: Path) -> None:
    pytest.importorskip("kv_store")
    argv = [sys.executable, "-m", "kv_replay.cli", "engine", "--model", "llama", "--backend", backend.name]
    argv += ["--quiet", "--limit", "6", "--remote", f"file:{tmp_path / 'store'}", "--check", "--json"]
    runs = [json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout) for _ in range(2)]
    assert runs[0]["reused_by_level"]["remote"] == 0
    assert runs[1]["reused_by_level"]["remote"] > 0
    # --check: every request's tokens with reuse equal a run without any.
    assert runs[0]["check"]["identical"] and runs[1]["check"]["identical"]
