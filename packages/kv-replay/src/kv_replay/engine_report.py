"""``kvcore engine``'s report: what the engine did with reuse (and, with ``--check``, without),
as the fields of ``--json`` and as text. Its header names what ran, as every kvcore report's
does (trace, backend, model, quotas), and how requests were submitted."""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np

from kv_api import Backend
from kv_replay.header import quotas
from kv_replay.plural import plural
from kv_replay.trace import Request

if TYPE_CHECKING:
    from kv_engine import Engine, EngineStats, Output

__all__ = ["Run", "report", "text"]


@dataclasses.dataclass
class Run:
    """One engine's side: its outputs (request order), and the seconds its ``generate`` calls took."""

    engine: Engine
    outputs: list[Output] = dataclasses.field(default_factory=list)
    wall_s: float = 0.0


def _ttft(outputs: list[Output]) -> tuple[float, float]:
    p50, p99 = np.percentile([o.ttft_s for o in outputs], [50, 99])
    return float(p50), float(p99)


def _numbers(run: Run, requests: list[Request]) -> dict[str, Any]:
    """What one engine did: tokens reused and computed, throughput, TTFT."""
    stats: EngineStats = run.engine.stats
    generated = sum(len(o.tokens) for o in run.outputs)
    decode = sum(len(o.tokens) - 1 for o in run.outputs)  # the last token is never forwarded
    p50, p99 = _ttft(run.outputs)
    return {
        "prompt_tokens": sum(r.prompt_length for r in requests),
        "reused_tokens": stats.reused_tokens,
        "prefill_tokens_computed": stats.computed_tokens - decode,
        "decode_tokens_computed": decode,
        "generated_tokens": generated,
        "preemptions": stats.preemptions,
        "wall_s": run.wall_s,
        "forward_s": stats.forward_s,
        "manager_s": stats.manager_s,
        "tokens_per_s": stats.computed_tokens / run.wall_s if run.wall_s else 0.0,
        "generated_per_s": generated / run.wall_s if run.wall_s else 0.0,
        "ttft_p50_s": p50,
        "ttft_p99_s": p99,
    }


def _levels(args: argparse.Namespace) -> list[str]:
    host = ["host"] if args.host_quota is not None else []
    remote = ["remote"] if getattr(args, "remote", None) is not None else []
    return ["device", *host, *(["disk"] if args.disk_quota is not None else []), *remote]


def _mismatches(requests: list[Request], runs: list[Run]) -> list[dict[str, Any]]:
    """The requests whose tokens differ between the run with reuse and the one without."""
    found = []
    for i, (request, a, b) in enumerate(zip(requests, runs[0].outputs, runs[1].outputs, strict=True)):
        if a.tokens != b.tokens:
            at = next((k for k, (x, y) in enumerate(zip(a.tokens, b.tokens, strict=False)) if x != y), None)
            at = min(len(a.tokens), len(b.tokens)) if at is None else at
            found.append({"request": request.name, "index": i, "position": at, "reuse": a.tokens, "no_reuse": b.tokens})
    return found


def _model(runs: list[Run], args: argparse.Namespace, vocab: int, models: tuple[str, ...]) -> str:
    """``llama (tiny, random weights): 2 full-attention layers, vocabulary 256, float64``; by group,
    ``bamba (...): 3 layers: 2 SSM, 1 full-attention, ...``."""
    layout = runs[0].engine.layout
    words = {"full": "full-attention", "sliding": "sliding-window", "ssm": "SSM", "hybrid": "hybrid"}
    counts: dict[str, int] = {}
    for each in layout.kinds:
        counts[each] = counts.get(each, 0) + 1

    def group(kind: str, n: int, layers: bool) -> str:
        name = f"{n:,} {words.get(kind, 'MLP-only')}" + (f" {'layer' if n == 1 else 'layers'}" if layers else "")
        if kind == "sliding":
            return f"{name} (window {layout.window:,})"
        return f"{name} (attention and SSM each)" if kind == "hybrid" else name

    if len(counts) == 1:
        ((kind, n),) = counts.items()
        layers = group(kind, n, True)
    else:
        layers = f"{plural(len(layout.kinds), 'layer')}: " + ", ".join(group(k, n, False) for k, n in counts.items())
    what = "tiny, random weights" if args.model in models else "checkpoint"
    return f"{args.model} ({what}): {layers}, vocabulary {vocab:,}, {args.dtype}"


def _per_request(requests: list[Request], outputs: list[Output]) -> list[dict[str, Any]]:
    return [
        {
            "name": r.name,
            "prompt_tokens": r.prompt_length,
            "reused_tokens": o.reused_tokens,
            "generated_tokens": len(o.tokens),
            "preemptions": o.preemptions,
            "ttft_s": o.ttft_s,
            "latency_s": o.latency_s,
        }
        for r, o in zip(requests, outputs, strict=True)
    ]


def report(
    args: argparse.Namespace,
    backend: Backend,
    requests: list[Request],
    runs: list[Run],
    vocab: int,
    models: tuple[str, ...],
) -> dict[str, Any]:
    """The report's fields (``--json`` prints them as they are); ``runs[1]``, if any, is the check's."""
    from kv_replay.engine_command import new_tokens, waves  # it imports this module

    numbers = _numbers(runs[0], requests)
    by_level = [sum(o.reused_by_level[k] for o in runs[0].outputs) for k in range(len(_levels(args)))]
    check = None
    if len(runs) > 1:
        mismatches = _mismatches(requests, runs)
        check = {"identical": not mismatches, "mismatches": mismatches, "no_reuse": _numbers(runs[1], requests)}
    lengths = new_tokens(requests, args.max_new_tokens)
    return {
        "trace": args.trace if args.trace is not None else f"embedded workload (seed {args.seed})",
        "requests": len(requests),
        "backend": backend.name,
        "model": args.model,
        "model_detail": _model(runs, args, vocab, models),
        "vocabulary": vocab,
        "dtype": args.dtype,
        "tokens_per_block": args.tokens_per_block,
        "prefill_chunk": runs[0].engine.prefill_chunk,
        "max_running": args.max_running,
        "max_new_tokens": args.max_new_tokens,
        "waves": len(waves(lengths, args.max_running)),
        "quotas": quotas([args.device_quota], [args.host_quota] if args.host_quota else None, args.disk_quota),
        **numbers,
        "reused_by_level": dict(zip(_levels(args), by_level, strict=True)),
        "check": check,
        "per_request": _per_request(requests, runs[0].outputs),
    }


def _seconds(s: float) -> str:
    return f"{s:.3f} s" if s < 10 else f"{s:,.1f} s"


def text(r: dict[str, Any]) -> str:
    """The report as text: what ran (as the other reports' headers), then the numbers."""
    share = r["reused_tokens"] / r["prompt_tokens"] if r["prompt_tokens"] else 0.0
    levels = r["reused_by_level"]
    where = "; " + ", ".join(f"{k} {v:,}" for k, v in levels.items()) if len(levels) > 1 else ""
    lines = [
        f"trace: {r['trace']}, {plural(r['requests'], 'request')}",
        f"backend: {r['backend']}",
        f"model: {r['model_detail']}; token ids taken modulo {r['vocabulary']:,}",
        f"engine: {plural(r['tokens_per_block'], 'token')} per block, prefill chunks of {r['prefill_chunk']:,} "
        f"tokens, up to {r['max_running']:,} requests at once, at most {plural(r['max_new_tokens'], 'new token')} each",
        f"quotas: {r['quotas']}",
        f"submitted: in arrival order, in {plural(r['waves'], 'wave')} (one generate call each); "
        "TTFT is from a wave's submission to a request's first token",
        "",
        f"requests                 {r['requests']:,}",
        f"tokens per second        {r['tokens_per_s']:,.0f} (prefill + decode), {r['generated_per_s']:,.1f} generated",
        f"TTFT p50 / p99           {_seconds(r['ttft_p50_s'])} / {_seconds(r['ttft_p99_s'])}",
        f"reused tokens            {r['reused_tokens']:,} of {r['prompt_tokens']:,} prompt tokens ({share:.1%}{where})",
        f"prefill tokens computed  {r['prefill_tokens_computed']:,}",
        f"generated tokens         {r['generated_tokens']:,}",
        f"preemptions              {r['preemptions']:,}",
        f"time                     {_seconds(r['wall_s'])} (forwards {_seconds(r['forward_s'])}, "
        f"kvcore {_seconds(r['manager_s'])})",
    ]
    if r["check"] is not None:
        lines += ["", *_check_text(r)]
    return "\n".join(lines)


def _check_text(r: dict[str, Any]) -> list[str]:
    check = r["check"]
    base = check["no_reuse"]
    ratio = base["wall_s"] / r["wall_s"] if r["wall_s"] else 0.0
    lines = [
        f"no-reuse run: {base['prefill_tokens_computed']:,} prefill tokens computed, TTFT p50 "
        f"{_seconds(base['ttft_p50_s'])} / p99 {_seconds(base['ttft_p99_s'])}, {_seconds(base['wall_s'])} "
        f"({ratio:.2f}x the time with reuse)",
    ]
    if check["identical"]:
        return [*lines, f"check: every output equals the no-reuse run's ({plural(r['requests'], 'request')})"]
    bad = check["mismatches"]
    lines.append(f"check: {len(bad):,} of {plural(r['requests'], 'output')} differ from the no-reuse run's:")
    for m in bad:
        a, b = m["reuse"], m["no_reuse"]
        k = m["position"]
        got = f"token {k} is {a[k] if k < len(a) else 'missing'} with reuse, {b[k] if k < len(b) else 'missing'}"
        lines.append(f"  {m['request']} (request {m['index']}): {got} without")
    if r["dtype"] != "float64":
        lines.append("  (outside float64, a reused prefix's cuts may round differently: --dtype float64 is exact)")
    return lines
