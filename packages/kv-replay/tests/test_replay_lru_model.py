"""The replayed hit rate equals what a simple LRU prefix cache computes, on every backend.

With one request in flight, full attention, whole-block reuse and every length a multiple of
the block size, the manager must behave exactly like this model: a cache of full blocks keyed
by their prefix, least recently released evicted first, a request's blocks released deepest
first when it ends (evicting a block also drops its cached descendants).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path

import jsonschema
import numpy as np
import pytest

import kv_api
from kv_replay.cli import main
from kv_replay.model import model_config
from kv_replay.replayer import Replayer
from kv_replay.report import SWEEP_SCHEMA
from kv_replay.trace import Request, synthetic_tokens

TPB = 4
SLOTS = 64


def small_trace() -> list[Request]:
    """Multi-turn sessions sharing two system prompts, plus repeated documents; all lengths
    are multiples of the block size."""
    rng = np.random.default_rng(7)
    systems = [synthetic_tokens(1, 24, stream=10 + i) for i in range(2)]
    requests: list[Request] = []
    histories = [systems[s % 2] for s in range(6)]
    stream = 100
    for turn in range(4):
        for s in range(6):
            stream += 1
            user = synthetic_tokens(1, TPB * int(rng.integers(1, 5)), stream=stream)
            prompt = np.concatenate([histories[s], user])
            output = synthetic_tokens(1, TPB * int(rng.integers(1, 3)), stream=stream + 10_000)
            requests.append(Request(prompt, output))
            histories[s] = np.concatenate([prompt, output])
        doc = synthetic_tokens(1, 48, stream=50 + turn % 2)
        stream += 1
        requests.append(
            Request(
                np.concatenate([doc, synthetic_tokens(1, TPB, stream=stream)]),
                synthetic_tokens(1, TPB, stream=stream + 10_000),
            )
        )
    return requests


def lru_model(requests: list[Request], slots: int) -> tuple[int, int]:
    """(reused tokens, evicted blocks) of the model."""
    cached: OrderedDict[tuple[int, ...], None] = OrderedDict()  # oldest first
    free, reused, evicted = slots, 0, 0

    def allocate(n: int) -> None:
        nonlocal free, evicted
        while free < n:
            victim, _ = cached.popitem(last=False)
            evicted += 1
            free += 1
            for key in [k for k in cached if k[: len(victim)] == victim]:
                del cached[key]
                free += 1
        free -= n

    for r in requests:
        prompt, full = tuple(int(t) for t in r.prompt), tuple(int(t) for t in np.concatenate([r.prompt, r.output]))
        matched = 0
        while matched + TPB <= len(prompt) and prompt[: matched + TPB] in cached:
            matched += TPB
        reused += matched
        for k in range(TPB, matched + TPB, TPB):
            del cached[prompt[:k]]  # held while the request runs
        allocate((len(prompt) - matched) // TPB)
        for _ in range(len(r.output) // TPB):
            allocate(1)
        for k in range(len(full), 0, -TPB):  # released deepest first
            cached[full[:k]] = None
    return reused, evicted


def test_hit_rate_matches_lru_model(backend: kv_api.Backend) -> None:
    requests = small_trace()
    config = model_config("1", TPB, 2 << 20, (2 << 20) // (2 * TPB * SLOTS), partial_reuse=False)
    replayer = Replayer(backend, config, max_in_flight=1)
    assert replayer.manager.pool_group_descs[0].num_slots == SLOTS
    result = replayer.run(requests)
    reused, evicted = lru_model(requests, SLOTS)
    assert evicted > 0 and 0 < reused < sum(len(r.prompt) for r in requests)  # the trace exercises both
    assert sum(r.reused_tokens for r in result.records) == reused
    assert result.evicted_pages == evicted
    assert [r.reused_tokens for r in result.records] == [
        r.reused_tokens for r in Replayer(backend, config, 1).run(requests).records
    ]


def test_sweep_rows_match_lru_model(
    backend: kv_api.Backend, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--quota A,B,C``: each row is the LRU model at that many slots, and the unbounded row
    is the model with room for everything."""
    requests = small_trace()
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        "".join(json.dumps({"tokens": r.prompt.tolist(), "output": r.output.tolist()}) + "\n" for r in requests)
    )
    bytes_per_token = (2 << 20) // (2 * TPB * 32)  # 32 slots per 2 MiB granule
    argv = ["replay", str(trace), "--backend", backend.name, "--json", "--quiet", "--layers", "1"]
    argv += ["--tokens-per-block", str(TPB), "--bytes-per-token", str(bytes_per_token), "--max-in-flight", "1"]
    code = main([*argv, "--no-partial-reuse", "--quota", "8M,2M,4M,16M"])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    jsonschema.validate(report, SWEEP_SCHEMA)
    assert [row["quota"] for row in report["rows"]] == [2 << 20, 4 << 20, 8 << 20, 16 << 20]  # sorted
    for row in report["rows"]:
        reused, evicted = lru_model(requests, 32 * row["quota"] // (2 << 20))
        assert (row["reused_tokens"], row["evictions"]) == (reused, evicted), row["quota"]
    assert report["rows"][0]["evictions"] > report["rows"][-1]["evictions"]  # the sweep spans the curve
    (unbounded,) = report["unbounded"]
    assert (unbounded["reused_tokens"], unbounded["evictions"]) == (lru_model(requests, 1 << 30)[0], 0)
    assert unbounded["reused_tokens"] >= report["rows"][-1]["reused_tokens"]


def test_sweep_with_layer_groups_sharing_a_pool_group(
    backend: kv_api.Backend, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The unbounded row's ``initial_pool_ratio`` has one entry per layer group: a full and a
    windowed layer group of the same slot size share one pool group and its share."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        "".join(json.dumps({"tokens": r.prompt.tolist(), "output": r.output.tolist()}) + "\n" for r in small_trace())
    )
    argv = ["replay", str(trace), "--backend", backend.name, "--json", "--quiet", "--layers", "1,1x64"]
    code = main([*argv, "--tokens-per-block", str(TPB), "--quota", "2M,4M"])
    out, err = capsys.readouterr()
    assert code == 0, err
    (unbounded,) = json.loads(out)["unbounded"]
    assert unbounded["evictions"] == 0
