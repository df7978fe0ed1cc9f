"""The proof: a real model's keys, values and Mamba states live in kvcore's pages, and the
outputs with reuse equal ``model.generate(do_sample=False)`` without it, on every backend.

All models are float64, so the comparison is exact: the engine's forwards differ from
``generate``'s only in where K/V come from (pages vs a ``DynamicCache``) and in how the prefill
is cut (reused prefix, block-aligned chunks), and in float64 these tiny models give bitwise equal
logits for such cuts (chunk boundaries at multiples of 16 = the Mamba2 chunk size). In float32
the cuts change GEMM row tiling and the Mamba2 chunk-scan order, about 1e-7 (test_engine_float32.py).
A wrong page index changes logits by O(0.1-1), so the logit check catches it even where the
greedy tokens might survive.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_reference import check, model, tokens

import kv_api
import kv_engine

SYSTEM = tokens(1, 48)
ATTENTION_MODELS = ["llama", "qwen2", "mistral", "qwen2_swa"]


def engine(backend: kv_api.Backend, name: str, **kwargs: object) -> kv_engine.Engine:
    return kv_engine.Engine(model(name), backend=backend, keep_logits=True, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", [*ATTENTION_MODELS, "hybrid", "bamba"])
def test_system_prompt_reused(backend: kv_api.Backend, name: str) -> None:
    """A second and third request sharing a 48-token system prompt reuse it (the hybrids: up to
    the last block-end SSM snapshot in it) and produce exactly ``generate``'s outputs, also when
    they run concurrently."""
    e = engine(backend, name)
    first = SYSTEM + tokens(2, 5)
    [out] = e.generate([first], max_new_tokens=12)
    assert out.reused_tokens == 0
    check(name, first, out)
    later = [SYSTEM + tokens(3, 9), SYSTEM + tokens(4, 20)]
    outs = e.generate(later, max_new_tokens=12)
    for prompt, o in zip(later, outs, strict=True):
        assert o.reused_tokens == 48
        check(name, prompt, o)
    assert e.stats.computed_tokens == 53 + 11 + sum(len(p) - 48 + 11 for p in later)


@pytest.mark.parametrize("name", ["llama", "mistral", "hybrid"])
def test_multi_turn_chat(backend: kv_api.Backend, name: str) -> None:
    """Turn n+1's prompt is turn n's prompt, its answer and a new user message; each turn reuses
    all of turn n but the answer's last token (never forwarded, so never committed).

    The hybrid's logits differ from the reference by about 1e-9 from turn 2 on: the reused SSM
    state (always float32) was advanced token by token through the answer (the decode
    recurrence), the reference's by one chunked scan over the whole prompt; the sums run in
    another order. The tokens are equal; a wrong state or page differs by O(0.1)."""
    e = engine(backend, name)
    prompt = SYSTEM + tokens(5, 7)
    atol = 1e-6 if name == "hybrid" else 0.0
    expected = 0
    for turn in range(3):
        [out] = e.generate([prompt], max_new_tokens=10)
        check(name, prompt, out, atol)
        if turn:
            assert out.reused_tokens == expected
        prompt = prompt + out.tokens + tokens(10 + turn, 6)
        expected = len(prompt) - 6 - 1


def test_other_salt_reuses_nothing(backend: kv_api.Backend) -> None:
    """The same prompt under another tenant's salt (or LoRA id) reuses nothing, and is right."""
    e = engine(backend, "llama")
    prompt = SYSTEM + tokens(6, 4)
    tenant_a, tenant_b = kv_api.ReuseScope(salt=1), kv_api.ReuseScope(salt=2)
    [a] = e.generate([prompt], max_new_tokens=8, scopes=[tenant_a])
    outs = e.generate(
        [prompt, prompt, prompt], max_new_tokens=8, scopes=[tenant_b, kv_api.ReuseScope(lora_id=3), tenant_a]
    )
    assert [o.reused_tokens for o in outs] == [0, 0, len(prompt) - 1]
    for o in [a, *outs]:
        check("llama", prompt, o)


@pytest.mark.parametrize("name", ["mistral", "qwen2_swa"])
def test_window_pages_released(backend: kv_api.Backend, name: str) -> None:
    """A long generation with a window of 16 (tpb 16) holds at most 3 pages per window layer
    (the window's 2 blocks, plus the block behind it kept until it is committed), while a full
    attention layer holds all 10; the outputs stay exact."""
    e = engine(backend, name)
    prompt = tokens(7, 30)
    [out] = e.generate([prompt], max_new_tokens=130)
    check(name, prompt, out)
    layout = e.layout
    for i, kind in enumerate(layout.kinds):
        group = e.views.group_of[layout.attention_layer_id(i)]
        if kind == "sliding":
            assert e.stats.peak_blocks[group] <= 3
        else:
            assert e.stats.peak_blocks[group] == -(-(30 + 129) // 16)


def test_hybrid_starts_from_reused_snapshot(backend: kv_api.Backend) -> None:
    """A second request with the same 64-token prefix starts from the SSM snapshot kvcore took at
    token 64, skipping those tokens' compute."""
    e = engine(backend, "hybrid")
    prefix = tokens(8, 64)
    [a] = e.generate([prefix + tokens(9, 3)], max_new_tokens=6)
    computed = e.stats.computed_tokens
    [b] = e.generate([prefix + tokens(10, 5)], max_new_tokens=6)
    assert a.reused_tokens == 0 and b.reused_tokens == 64
    assert e.stats.computed_tokens - computed == 5 + 5
    check("hybrid", prefix + tokens(9, 3), a)
    check("hybrid", prefix + tokens(10, 5), b)


def test_local_checkpoint_loads(tmp_path: Path, backend: kv_api.Backend) -> None:
    """A ``save_pretrained`` directory loads (no network) and runs identically."""
    model("qwen2").save_pretrained(tmp_path)
    loaded = kv_engine.load_model(tmp_path)
    prompt = tokens(11, 20)
    [out] = kv_engine.Engine(loaded, backend=backend, keep_logits=True).generate([prompt], max_new_tokens=8)
    check(loaded, prompt, out)


@pytest.mark.parametrize("host", [False, True])
def test_preempted_and_resumed(backend: kv_api.Backend, host: bool) -> None:
    """Six 400-token requests on a 2 MiB device level (128 blocks of Llama's K/V) cannot all run:
    the youngest are preempted when ``resize`` fails (suspended with a host tier, closed and
    re-matched without), resumed later, and every output is still exact."""
    e = engine(backend, "llama", device_quota=2 << 20, host_quota=(16 << 20) if host else None)
    prompts = [SYSTEM + tokens(20 + i, 352) for i in range(6)]
    outs = e.generate(prompts, max_new_tokens=8)
    assert e.stats.preemptions > 0
    assert sum(o.preemptions for o in outs) == e.stats.preemptions
    for prompt, o in zip(prompts, outs, strict=True):
        check("llama", prompt, o)
