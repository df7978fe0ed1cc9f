"""``kvcore engine``'s flags, and ``EngineError``: what the ``kvcore`` parser needs without importing
the command that runs (``kv_replay.engine_command``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kv_replay.flag_types import disk_path_flag, integer, metrics_port_flag, one_size, progress_flags, remote_flag
from kv_replay.sizes import parse_size
from kv_replay.trace import BUILTIN_TRACES, MAX_TOKENS

__all__ = ["DEFAULT_MAX_NEW_TOKENS", "DTYPES", "INSTALL", "MODELS", "EngineError", "add_parser", "model_spec"]

#: ``kv_engine.MODEL_NAMES``, known without importing torch (a test keeps them equal).
MODELS = ("llama", "qwen2", "mistral", "qwen2_swa", "hybrid", "bamba")
DTYPES = ("float64", "float32", "bfloat16")
DEFAULT_MAX_NEW_TOKENS = 8
INSTALL = "pip install ./packages/kv-engine; docs/engine.md says how to get a CPU-only torch"


class EngineError(Exception):
    """A bad flag, model or quota for ``kvcore engine``: the message names the flag."""


def model_spec(text: str) -> str:
    """``--model``: a tiny model's name, or a ``save_pretrained`` directory (checked here, loaded later)."""
    if text in MODELS:
        return text
    path = Path(text)
    if not path.is_dir():
        what = "a file" if path.exists() else "no such directory"
        raise argparse.ArgumentTypeError(
            f"{text[:80]!r} is neither a built-in model ({', '.join(MODELS)}) nor a checkpoint directory ({what})"
        )
    if not (path / "config.json").is_file():
        raise argparse.ArgumentTypeError(f"{text} has no config.json (not a save_pretrained checkpoint directory)")
    return text


def add_parser(sub: argparse._SubParsersAction[Any]) -> None:
    """``kvcore engine`` and its flags (called by ``kv_replay.cli.parser``)."""
    e = sub.add_parser(
        "engine",
        help="run a workload through a real model (the reference engine) and report throughput, TTFT and reuse",
        description="Run a workload through the reference engine (kv_engine: Hugging Face transformers on CPU "
        "torch, K/V and Mamba states in kvcore's pages) with real forward passes, and report throughput, TTFT, "
        "reused tokens and preemptions (docs/engine.md). Requests go in arrival order in waves of --max-running, "
        "one generate call each: TTFT is from a wave's submission to a request's first token. Token ids are "
        "taken modulo the model's vocabulary size; the model generates greedily as many tokens as the trace's "
        "output length, at most --max-new-tokens and at least 1. The requests of a wave start together: they "
        f"reuse what earlier waves committed, not each other's blocks. Needs kv_engine ({INSTALL}).",
    )
    e.set_defaults(compare=False)  # kv_replay.cli.chosen_backends: one backend
    e.add_argument(
        "trace",
        nargs="?",
        metavar="TRACE",
        help="a Mooncake or kvcore JSONL trace (.gz too; Mooncake hash ids expand to tokens as in kvcore replay), "
        f"or a built-in one: {', '.join(BUILTIN_TRACES)} (default: the embedded workload of chats and documents)",
    )
    e.add_argument(
        "--model",
        type=model_spec,
        required=True,
        metavar="NAME|DIR",
        help=f"a tiny random model ({', '.join(MODELS)}; hybrid is Falcon-H1; a vocabulary of 256 tokens, "
        "nothing downloaded) or a save_pretrained checkpoint directory (required)",
    )
    e.add_argument(
        "--backend", help="the backend to run on (default: $KV_BACKEND, else the highest-priority installed one)"
    )
    _memory_flags(e)
    _run_flags(e)


def _memory_flags(e: argparse.ArgumentParser) -> None:
    """The model's numbers and its memory: dtype, block size, prefill chunk, quotas, tiers."""
    e.add_argument(
        "--dtype",
        choices=DTYPES,
        default="float64",
        help="the model's dtype; float64 makes --check exact, as a reused prefix's cuts round alike (default: float64)",
    )
    e.add_argument(
        "--tokens-per-block", type=integer(1, 4096), default=16, metavar="N", help="block size (default: 16)"
    )
    e.add_argument(
        "--prefill-chunk",
        type=integer(1, MAX_TOKENS),
        metavar="N",
        help="tokens one prefill forward computes at most, a multiple of --tokens-per-block (default: the "
        "engine's, one block for models with Mamba layers, else 4 blocks)",
    )
    e.add_argument(
        "--device-quota", type=one_size, default=parse_size("64M"), metavar="SIZE", help="device quota (default: 64M)"
    )
    e.add_argument(
        "--host-quota",
        type=one_size,
        metavar="SIZE",
        help="add a host-memory tier below the device: preempted requests are suspended there and pages "
        "evicted from the device come back from it when reused (default: none, no host tier)",
    )
    e.add_argument(
        "--disk-quota", type=one_size, metavar="SIZE", help="add a disk tier of this size (default: none, no disk tier)"
    )
    disk_path_flag(e)
    remote_flag(e)


def _run_flags(e: argparse.ArgumentParser) -> None:
    """How the workload runs, and what comes out."""
    e.add_argument(
        "--max-running",
        type=integer(1, 1 << 16),
        default=8,
        metavar="N",
        help="requests the engine runs at once, and the size of a wave (default: 8)",
    )
    e.add_argument(
        "--max-new-tokens",
        type=integer(1, 1 << 20),
        default=DEFAULT_MAX_NEW_TOKENS,
        metavar="N",
        help=f"tokens a request generates at most: its trace output length, capped at N (default: "
        f"{DEFAULT_MAX_NEW_TOKENS}, as these are CPU forwards)",
    )
    e.add_argument(
        "--limit",
        type=integer(1, MAX_TOKENS),
        metavar="N",
        help="run only the first N requests of the trace; the rest is not read (default: all)",
    )
    e.add_argument(
        "--seed", type=integer(0, 2**64 - 1), default=0, metavar="N", help="seed of the embedded workload (default: 0)"
    )
    e.add_argument(
        "--threads",
        type=integer(1, 1024),
        default=1,
        metavar="N",
        help="torch's intra-op threads; tiny models gain nothing from more, and a spinning second thread on a "
        "busy machine makes forwards several times slower (default: 1)",
    )
    e.add_argument(
        "--check",
        action="store_true",
        help="run the same requests without reuse too and compare every request's tokens; exit 1 if any differ",
    )
    e.add_argument("--json", action="store_true", help="print the report as one JSON object")
    metrics_port_flag(e, "engine")
    progress_flags(e)
