"""The no-reuse reference the engine's outputs are checked against, and the checks.

``reference(model, prompt, n)`` is a float64 loop over transformers' own ``DynamicCache``
(one-shot prefill, ``logits_to_keep=1``, explicit position ids), asserted equal to
``model.generate(do_sample=False)``: the same tokens, and its logits cast to float32 bitwise
equal to ``generate``'s (which are float32 copies even for a float64 model). The engine is then
compared with the reference in float64: tokens equal and logits exactly equal (float32 models:
within a stated tolerance, test_engine_float32.py).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, cast

import torch
from transformers import DynamicCache, PreTrainedModel

import kv_engine

# One intra-op thread per test process. These models are tiny (hidden size 64): one GEMM is a
# few microseconds of work, so torch's thread pool only adds synchronisation, and under
# ``pytest -n N`` on N cores each worker's pool (one thread per core by default) oversubscribes
# the machine, every small op waiting on spinning siblings. Measured on 2 shared cores with
# ``-n 2``: a float64 64x64 linear took 30 ms with 2 threads and 30 us with 1, and
# test_engine.py 77-408 s against 17-52 s, by the machine's load. Engine and reference run in
# the same process, so they still compare the same computation. (Set here, not in a conftest.py: mypy checks every tests folder together, and a
# second top-level ``conftest`` module would collide with packages/kv-api/tests'.)
torch.set_num_threads(1)


@functools.cache
def _model(name: str, dtype: torch.dtype) -> PreTrainedModel:
    return kv_engine.tiny_model(name, dtype=dtype)


def model(name: str, dtype: torch.dtype = torch.float64) -> PreTrainedModel:
    """One tiny model per name and dtype per process (read only); float64 unless told."""
    return _model(name, dtype)


def _reference_loop(m: PreTrainedModel, prompt: Sequence[int], n: int) -> tuple[list[int], list[torch.Tensor]]:
    cache = DynamicCache(config=m.config)
    ids = torch.tensor([list(prompt)])
    pos = 0
    tokens: list[int] = []
    logits: list[torch.Tensor] = []
    with torch.no_grad():
        for _ in range(n):
            q = ids.shape[1]
            out = m(
                input_ids=ids,
                cache=cache,
                use_cache=True,
                position_ids=torch.arange(pos, pos + q)[None],
                logits_to_keep=1,
            )
            last = out.logits[0, -1]
            logits.append(last.clone())
            tokens.append(int(last.argmax()))
            pos += q
            ids = torch.tensor([[tokens[-1]]])
    return tokens, logits


_REFERENCES: dict[tuple[int, tuple[int, ...], int], tuple[list[int], list[torch.Tensor]]] = {}


def reference(m: PreTrainedModel, prompt: Sequence[int], n: int) -> tuple[list[int], list[torch.Tensor]]:
    """Tokens and float64 logits of ``m.generate(do_sample=False)`` (``m`` read only, kept alive)."""
    key = (id(m), tuple(prompt), n)
    if key not in _REFERENCES:
        _REFERENCES[key] = _reference(m, prompt, n)
    return _REFERENCES[key]


def _reference(m: PreTrainedModel, prompt: Sequence[int], n: int) -> tuple[list[int], list[torch.Tensor]]:
    tokens, logits = _reference_loop(m, prompt, n)
    ids = torch.tensor([list(prompt)])
    # An explicit mask: without one, generate masks out every prompt token equal to
    # pad_token_id (0), which a multi-turn prompt holds when the model generated a 0.
    gen = cast(Any, m).generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=n,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=0,
    )
    assert gen.sequences[0, len(prompt) :].tolist() == tokens, "reference loop != generate"
    for mine, theirs in zip(logits, gen.logits, strict=True):
        assert torch.equal(mine.to(torch.float32), theirs[0]), "reference logits != generate's"
    return tokens, logits


def check(m: PreTrainedModel | str, prompt: Sequence[int], out: kv_engine.Output, atol: float = 0.0) -> None:
    """``out`` is the no-reuse reference of model ``m`` (or ``model(m)``): the same tokens, the
    logits exactly equal (or within ``atol``), and not a degenerate continuation."""
    name = m if isinstance(m, str) else type(m).__name__
    tokens, logits = reference(model(m) if isinstance(m, str) else m, prompt, len(out.tokens))
    assert out.tokens == tokens
    assert len(set(tokens)) > 1, f"{name}: a degenerate model (one token repeated) would hide a wrong page"
    assert len(out.logits) == len(logits)
    for i, (mine, theirs) in enumerate(zip(out.logits, logits, strict=True)):
        diff = float((mine - theirs).abs().max())
        assert diff <= atol, f"{name}: step {i} logits differ by {diff} (allowed {atol})"


def tokens(seed: int, n: int) -> list[int]:
    """``n`` random token ids (no special ids 0-2)."""
    g = torch.Generator().manual_seed(seed)
    return [int(t) for t in torch.randint(3, kv_engine.models.VOCAB_SIZE, (n,), generator=g)]
