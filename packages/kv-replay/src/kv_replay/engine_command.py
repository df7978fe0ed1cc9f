"""``kvcore engine``: a workload through the reference engine's real forward passes (``kv_engine``:
Hugging Face transformers on CPU torch, keys, values and Mamba states in kvcore's pages), with
throughput, TTFT, reuse and preemptions; ``--check`` runs the same requests on a second engine
without reuse (``Engine(reuse=False)``) and compares every request's tokens.

- Requests go in arrival order, in waves of ``--max-running`` (one ``generate`` call each; a wave
  also ends where the number of tokens to generate changes, as one call generates one number).
  TTFT is from a wave's submission to a request's first token: the prefill of the wave's
  requests, run together, not the waiting for earlier waves. Requests of one wave are admitted
  together, so they reuse what earlier waves committed, not each other's blocks.
- Token ids are taken modulo the model's vocabulary size (equal ids, equal tokens: a shared
  prefix stays shared). The trace's outputs are not replayed: the model generates greedily as
  many tokens as a request's output length, at most ``--max-new-tokens`` and at least one.
- With ``--check`` the two engines run wave by wave in turn, so that the machine's drift falls on
  both; a request whose tokens differ is named, and the command exits with status 1.

``kv_engine`` (torch, transformers) is imported only here, when the command runs: ``kv_replay``
does not depend on it. Errors are ``EngineError``, one line naming the flag.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from kv_api import Backend, RemoteCacheTierConfig
from kv_api.errors import HostOOMError
from kv_replay.engine_flags import INSTALL, MODELS, EngineError, add_parser, model_spec
from kv_replay.engine_report import Run, report, text
from kv_replay.metrics import serving, watching
from kv_replay.plural import plural
from kv_replay.progress import ProgressBar
from kv_replay.remote_store import open_store
from kv_replay.replay_command import check_tiers
from kv_replay.sizes import format_size
from kv_replay.trace import Request, load_trace
from kv_replay.workload import default_workload

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from kv_engine import Engine

# -- running ----------------------------------------------------------------------------------------


def _import_engine() -> ModuleType:
    try:
        import kv_engine
    except ImportError as exc:
        missing = exc.name if exc.name in ("torch", "transformers") else "kv_engine"
        raise EngineError(f"engine: {missing} is not installed ({INSTALL})") from None
    return kv_engine


def _requests(args: argparse.Namespace) -> list[Request]:
    if args.trace is not None:
        return load_trace(args.trace, args.limit)
    return default_workload(args.seed)[: args.limit]


def new_tokens(requests: list[Request], most: int) -> list[int]:
    """Tokens each request generates: its output length, at most ``most``, at least 1 (its first
    token is what TTFT measures)."""
    return [max(1, min(len(r.output), most)) for r in requests]


def waves(lengths: list[int], max_running: int) -> list[range]:
    """Consecutive requests, at most ``max_running``, generating as many tokens as each other."""
    waves: list[range] = []
    start = 0
    for i in range(1, len(lengths) + 1):
        if i == len(lengths) or i - start == max_running or lengths[i] != lengths[start]:
            waves.append(range(start, i))
            start = i
    return waves


def _load_model(kv_engine: ModuleType, args: argparse.Namespace) -> PreTrainedModel:
    import torch
    import transformers

    dtype = getattr(torch, args.dtype)
    if args.model in MODELS:
        model: PreTrainedModel = kv_engine.tiny_model(args.model, dtype=dtype)
        return model
    bars: Any = transformers.utils.logging  # untyped
    shown = ProgressBar("", quiet=args.quiet, forced=args.progress).shown
    was = bars.is_progress_bar_enabled()
    (bars.enable_progress_bar if shown else bars.disable_progress_bar)()  # its "Loading weights" bar as ours
    try:
        model = kv_engine.load_model(args.model, dtype=dtype)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, ImportError) as exc:
        raise EngineError(f"--model {args.model}: cannot load it: {_first_line(exc)}") from None
    finally:
        (bars.enable_progress_bar if was else bars.disable_progress_bar)()
    return model


def _vocabulary(model: PreTrainedModel) -> int:
    """The token ids the model embeds (the trace's are taken modulo this)."""
    return int(getattr(model.get_input_embeddings(), "num_embeddings", None) or model.config.vocab_size)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def _build(
    kv_engine: ModuleType, model: PreTrainedModel, args: argparse.Namespace, backend: Backend, reuse: bool
) -> Engine:
    """An engine with the flags' quotas; the manager's refusals as the flag behind them."""

    def build(host_quota: int | None) -> Engine:
        engine: Engine = kv_engine.Engine(
            model,
            backend,
            args.tokens_per_block,
            args.device_quota,
            host_quota,
            args.disk_quota,
            args.disk_dir,
            max_running=args.max_running,
            prefill_chunk=args.prefill_chunk,
            reuse=reuse,
            remote=_remote(args),
        )
        return engine

    try:
        return build(args.host_quota)
    except HostOOMError as exc:
        # The error names its level (docs/errors.md, "Which level"); the host level is level 1.
        if args.host_quota is not None and getattr(exc, "level", None) == 1:
            flag = f"--host-quota {format_size(args.host_quota)}"
        else:
            flag = f"--device-quota {format_size(args.device_quota)}"
        raise EngineError(f"{flag}: {exc}: more address space than this machine has") from None
    except ValueError as exc:  # the model's layers (model_layout): main() checked the prefill chunk
        raise EngineError(f"--model {args.model}: {exc}") from None


def _remote(args: argparse.Namespace) -> RemoteCacheTierConfig | None:
    """``--remote``'s tier: keys name the model and its dtype, so no other weights' K/V is read."""
    if args.store is None:
        return None
    name = args.model if args.model in MODELS else Path(args.model).name
    return RemoteCacheTierConfig(args.store, f"kv-engine/{name}", args.dtype)


def _generate(
    run: Run, wave: list[Request], new_tokens: int, prompts: list[list[int]], args: argparse.Namespace
) -> None:
    """One wave through one engine; a request that cannot fit names the quota."""
    scopes = [r.scope for r in wave]
    start = time.perf_counter()
    try:
        run.outputs += run.engine.generate(prompts, max_new_tokens=new_tokens, scopes=scopes)
    except RuntimeError as exc:  # the engine could not make room for a request
        m = re.match(r"request (\d+): (.*)", str(exc))
        if m is None or not 0 <= int(m.group(1)) < len(wave):
            raise
        request = wave[int(m.group(1))]
        without = "reuse" if run.engine.reuse else "the no-reuse check"
        host = "a larger --host-quota" if args.host_quota is not None else "a --host-quota"
        raise EngineError(
            f"--device-quota {format_size(args.device_quota)}: {request.name} ({plural(request.prompt_length, 'token')}"
            f", in the run with {without}): {m.group(2)} (give a larger --device-quota, {host}, or a smaller "
            "--max-running)"
        ) from None
    except IndexError as exc:  # a checkpoint's learned positions, shorter than a prompt
        longest = max(wave, key=lambda r: r.prompt_length)
        raise EngineError(
            f"--model {args.model}: a forward failed ({_first_line(exc)}) in a wave whose longest prompt, "
            f"{longest.name}, has {plural(longest.prompt_length, 'token')}: more positions than the model has?"
        ) from None
    run.wall_s += time.perf_counter() - start


def _run(runs: list[Run], requests: list[Request], vocab: int, args: argparse.Namespace, label: str) -> None:
    """Every wave through every engine in turn (the check's engine right after the one reusing)."""
    lengths = new_tokens(requests, args.max_new_tokens)
    with ProgressBar(label, quiet=args.quiet, forced=args.progress) as bar:
        for wave in waves(lengths, args.max_running):
            batch = [requests[i] for i in wave]
            prompts = [(r.prompt.astype(np.int64) % vocab).tolist() for r in batch]
            for run in runs:
                _generate(run, batch, lengths[wave.start], prompts, args)
            if bar.callback is not None:
                bar.callback(wave.stop, len(requests))


@contextmanager
def _disk_dir(args: argparse.Namespace) -> Iterator[None]:
    """``args.disk_dir``: ``--disk-path``, or a temporary directory removed after the run."""
    if args.disk_quota is None or args.disk_path is not None:
        args.disk_dir = args.disk_path
        yield
        return
    with tempfile.TemporaryDirectory(prefix="kvcore-engine-") as tmp:
        args.disk_dir = tmp
        yield


@contextmanager
def _threads(n: int) -> Iterator[None]:
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def engine(args: argparse.Namespace, backend: Backend) -> int:
    if args.disk_path is not None and args.disk_quota is None:
        raise EngineError("--disk-path: needs --disk-quota (there is no disk tier without a quota)")
    if args.prefill_chunk is not None and args.prefill_chunk % args.tokens_per_block:
        raise EngineError(
            f"--prefill-chunk: {args.prefill_chunk:,} is not a multiple of --tokens-per-block {args.tokens_per_block}"
        )
    kv_engine = _import_engine()
    check_tiers(args, [backend])
    requests = _requests(args)
    with _threads(args.threads), _disk_dir(args), ExitStack() as stack:
        args.store = stack.enter_context(open_store(args.remote)) if args.remote is not None else None
        name = args.model if args.model in MODELS else Path(args.model).name
        stack.enter_context(serving(args.metrics_port, name))
        model = _load_model(kv_engine, args)
        vocab = _vocabulary(model)
        runs = [Run(_build(kv_engine, model, args, backend, reuse=True))]
        if args.check:
            runs.append(Run(_build(kv_engine, model, args, backend, reuse=False)))
        with ExitStack() as watched:  # --metrics-port: forgotten before they close
            for label, run in zip(("0", "check"), runs, strict=False):  # the check's engine: without reuse
                watched.enter_context(watching(run.engine, label))
            _run(runs, requests, vocab, args, f"engine ({name}, {backend.name}{', checked' if args.check else ''})")
        # Only now: a generate call stopped midway (Ctrl-C, a request that does not fit) leaves
        # caches open, which shutdown() refuses; the process ends, as kvcore replay's does then.
        for run in runs:
            run.engine.close()
    result = report(args, backend, requests, runs, vocab, models=MODELS)
    print(json.dumps(result, indent=2) if args.json else text(result))
    return 0 if result["check"] is None or result["check"]["identical"] else 1


__all__ = ["MODELS", "EngineError", "add_parser", "engine", "model_spec", "new_tokens", "waves"]
