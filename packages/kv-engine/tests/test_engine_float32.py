"""float32 models: the greedy tokens equal ``model.generate(do_sample=False)``'s and the logits lie
within ``ATOL`` of the float32 reference loop (itself bitwise equal to ``generate``'s).

Where the difference comes from: the engine cuts the prefill where ``generate`` does not (the
reused prefix, then block-aligned chunks), so a GEMM over the new rows runs on other row tiles,
an attention row reduces over another key length (a window layer gathers from its first
non-stale block), and the float32 sums are added in another order; for the hybrid the Mamba2
state at a cut came from a chunked scan over other chunks, or, in a chat's next turn, from the
decode recurrence token by token. float64 hides all that (test_engine.py is exact); float32
shows it in the last bits. Measured over 6 system prompts (40, 48, 64 tokens), 2 concurrent
requests reusing each and 2 further chat turns, on both backends: at most 1.5e-7 (llama,
mistral) and 1.2e-7 (hybrid), 1-2 ulp of logits that reach 0.6 (std 0.16). Without reuse the
engine is bitwise ``generate``'s for llama (one prefill chunk), 1.5e-7 off for mistral (the
window) and 9e-8 for the hybrid (16-token chunks). ``ATOL`` is 13 times the worst.

What a wrong page or state does, measured once by mutating the engine (first generated token's
logits): block 0 read from block 1's page once 32 tokens are held, 0.03-0.17 (llama, hybrid;
mistral's window no longer reads block 0); the block behind the one being written read from
that block's page, 0.01-0.27 (llama, mistral); both Mamba layers on layer 0's conv/SSM state,
3.5e-5 to 2.4e-3 (the tiny hybrid's attention carries most of the signal). The tokens change
in most cases, and every one is far outside ``ATOL``.
"""

from __future__ import annotations

import pytest
import torch
from engine_reference import check, model, tokens

import kv_api
import kv_engine

ATOL = 2e-6


@pytest.mark.parametrize("name", ["llama", "mistral", pytest.param("hybrid", marks=pytest.mark.requires("ssm_layers"))])
def test_float32_reuse_and_chat(backend: kv_api.Backend, name: str) -> None:
    """Per system prompt (48 tokens, then 40: the hybrid reuses 32 of those, its last block-end
    snapshot): a first request, two concurrent ones reusing its prompt, two chat turns on the
    first of them reusing the whole conversation but its last token; all within ``ATOL``."""
    m = model(name, torch.float32)
    for seed, length in [(0, 48), (2, 40)]:
        e = kv_engine.Engine(m, backend=backend, keep_logits=True)
        system = tokens(100 + seed, length)
        first = system + tokens(200 + seed, 5)
        [out] = e.generate([first], max_new_tokens=12)
        check(m, first, out, ATOL)
        later = [system + tokens(300 + seed, 9), system + tokens(400 + seed, 20)]
        outs = e.generate(later, max_new_tokens=12)
        held = length // 16 * 16 if name == "hybrid" else length
        assert [o.reused_tokens for o in outs] == [held, held]
        for prompt, o in zip(later, outs, strict=True):
            check(m, prompt, o, ATOL)
        prompt = later[0] + outs[0].tokens + tokens(500 + seed, 6)
        for turn in range(2):
            [out] = e.generate([prompt], max_new_tokens=10)
            assert out.reused_tokens == len(prompt) - 7
            check(m, prompt, out, ATOL)
            prompt = prompt + out.tokens + tokens(600 + seed + turn, 6)
