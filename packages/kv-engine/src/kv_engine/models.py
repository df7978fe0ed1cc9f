"""Tiny seeded models for tests and demos (nothing is downloaded), and local checkpoints.

``tiny_model(name)`` builds a small random model of one architecture: ``llama``, ``qwen2``,
``mistral`` (a sliding window of 16 on every layer), ``qwen2_swa`` (layer 1 slides), ``hybrid``
(Falcon-H1: every layer carries attention and a Mamba2 mixer) and ``bamba`` (Mamba2 layers
around one attention layer). ``load_model(path)`` loads a ``save_pretrained`` directory.
"""

from __future__ import annotations

import logging
import os
from typing import Any, cast

import torch
import transformers

VOCAB_SIZE = 256

_COMMON: dict[str, Any] = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
_MAMBA: dict[str, Any] = {
    "mamba_n_heads": 4,
    "mamba_d_head": 32,
    "mamba_n_groups": 1,
    "mamba_d_state": 16,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_chunk_size": 16,
}

_MODELS: dict[str, tuple[type[Any], type[Any], dict[str, Any]]] = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {"num_hidden_layers": 2}),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, {"num_hidden_layers": 2}),
    "mistral": (
        transformers.MistralConfig,
        transformers.MistralForCausalLM,
        {"num_hidden_layers": 2, "sliding_window": 16},
    ),
    "qwen2_swa": (
        transformers.Qwen2Config,
        transformers.Qwen2ForCausalLM,
        {"num_hidden_layers": 2, "use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1},
    ),
    "hybrid": (
        transformers.FalconH1Config,
        transformers.FalconH1ForCausalLM,
        {"num_hidden_layers": 2, "mamba_d_ssm": 128, "head_dim": 16, **_MAMBA},
    ),
    "bamba": (
        transformers.BambaConfig,
        transformers.BambaForCausalLM,
        {"num_hidden_layers": 3, "attn_layer_indices": [1], **_MAMBA},
    ),
}
MODEL_NAMES = tuple(_MODELS)


def _quiet() -> None:
    """The Mamba mixers log once that the CUDA kernels are missing; they fall back to torch."""
    logging.getLogger("transformers.integrations.hub_kernels").setLevel(logging.ERROR)


def tiny_model(name: str, dtype: torch.dtype = torch.float64, seed: int = 0) -> transformers.PreTrainedModel:
    """A tiny random ``name`` model (``MODEL_NAMES``), seeded, in eval mode, sdpa attention.
    Generation stops at max tokens only (no EOS)."""
    if name not in _MODELS:
        raise ValueError(f"unknown model {name!r} (choose from {', '.join(MODEL_NAMES)})")
    config_class, model_class, kwargs = _MODELS[name]
    _quiet()
    torch.manual_seed(seed)
    config = config_class(**_COMMON, **kwargs)
    config.eos_token_id = None
    model = model_class(config).eval().to(dtype)
    model.generation_config.eos_token_id = None
    model.set_attn_implementation("sdpa")
    return model  # type: ignore[no-any-return]


def load_model(path: str | os.PathLike[str], dtype: torch.dtype | None = None) -> transformers.PreTrainedModel:
    """A causal LM from a local ``save_pretrained`` directory (no network)."""
    _quiet()
    model: Any = transformers.AutoModelForCausalLM.from_pretrained(os.fspath(path), local_files_only=True)
    if dtype is not None:
        model = model.to(dtype)
    return cast(transformers.PreTrainedModel, model.eval())
