"""The no-reuse reference the engine's outputs are checked against, and the checks.

``reference(model, prompt, n)`` is a float64 loop over transformers' own ``DynamicCache``
(one-shot prefill, ``logits_to_keep=1``, explicit position ids), asserted equal to
``model.generate(do_sample=False)``: the same tokens, and its logits cast to float32 bitwise
equal to ``generate``'s (which are float32 copies even for a float64 model). The engine is then
compared with the reference in float64: tokens equal and logits exactly equal.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, cast

import torch
from transformers import DynamicCache, PreTrainedModel

import kv_engine


@functools.cache
def _model(name: str) -> PreTrainedModel:
    return kv_engine.tiny_model(name, dtype=torch.float64)


def model(name: str) -> PreTrainedModel:
    """One tiny float64 model per name per process (read only)."""
    return _model(name)


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
    gen = cast(Any, m).generate(
        torch.tensor([list(prompt)]),
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
