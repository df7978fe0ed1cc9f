"""Reference engine benchmark (packages/kv-engine, docs/engine.md): what kvcore's reuse buys a
real forward loop, what kvcore costs per engine step, and what a sliding window saves in
resident pages, per backend, side by side in one run.

- Multi-turn chat: ``--conversations`` conversations of ``--turns`` turns sharing a system
  prompt; turn n+1's prompt is turn n's prompt, its answer and a new user message. Each turn's
  requests (one per conversation) are one ``generate`` call, so a request's TTFT is measured
  from its wave's arrival. An engine with reuse and one without (``Engine(reuse=False)``, the
  baseline) run the same conversations, their waves alternating so that the machine's drift
  falls on both. Prefill tokens computed, mean and p50 TTFT and wall time, reuse over none.
- The manager's share of an engine step on the same runs: ``stats.manager_s`` (seconds in
  kvcore's calls) over ``manager_s + forward_s`` (seconds in the model's forwards).
- Resident page memory: one long generation with the ``mistral`` tiny model (a window of 16
  on every layer) and with its full-attention twin (same weights, ``sliding_window=None``):
  the most pages one request held per layer group (``stats.peak_blocks``) times the group's
  page bytes (every layer's key and value strides).

The tiny models are float32 (a real engine's dtype, not the tests' float64) and torch runs on
one thread (``--threads``): these models are too small for intra-op parallelism, and on a
shared 2-core machine a second spinning thread makes the forwards several times slower and
erratic. The figures to read are the ratios; the absolute times are tiny-model CPU forwards.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel

import kv_api
import kv_engine
from kv_engine.layout import KV_ROLES

TPB = 16


def tokens(seed: int, n: int) -> list[int]:
    """``n`` random token ids (no special ids 0-2), as the engine's tests draw them."""
    g = torch.Generator().manual_seed(seed)
    return [int(t) for t in torch.randint(3, kv_engine.models.VOCAB_SIZE, (n,), generator=g)]


@dataclass
class Chat:
    """One engine's side of the multi-turn workload: every conversation's next prompt."""

    engine: kv_engine.Engine
    prompts: list[list[int]]
    ttft: list[float] = field(default_factory=list)
    answers: list[list[int]] = field(default_factory=list)
    wall: float = 0.0
    requests: int = 0

    def turn(self, turn: int, user: int, new_tokens: int) -> None:
        """One wave: every conversation's turn ``turn`` in one ``generate`` call; then each next
        prompt is this prompt, its answer and a new user message."""
        start = time.perf_counter()
        outs = self.engine.generate(self.prompts, max_new_tokens=new_tokens)
        self.wall += time.perf_counter() - start
        self.requests += len(outs)
        self.ttft += [o.ttft_s for o in outs]
        self.answers += [o.tokens for o in outs]
        self.prompts = [
            p + o.tokens + tokens(1000 + 100 * turn + c, user)
            for c, (p, o) in enumerate(zip(self.prompts, outs, strict=True))
        ]


@dataclass(frozen=True)
class ChatResult:
    prefill: int  # prompt tokens forwarded (recomputed ones included)
    reused: int
    preemptions: int
    ttft_mean: float
    ttft_p50: float
    wall: float
    manager_s: float
    forward_s: float
    steps: int
    answers: tuple[tuple[int, ...], ...]

    @property
    def share(self) -> float:
        return self.manager_s / (self.manager_s + self.forward_s)


def result(chat: Chat, new_tokens: int) -> ChatResult:
    s = chat.engine.stats
    # Each request forwards its prompt (less what was reused) and new_tokens - 1 decode tokens:
    # the last generated token is never forwarded.
    prefill = s.computed_tokens - chat.requests * (new_tokens - 1)
    return ChatResult(
        prefill,
        s.reused_tokens,
        s.preemptions,
        statistics.fmean(chat.ttft),
        statistics.median(chat.ttft),
        chat.wall,
        s.manager_s,
        s.forward_s,
        s.steps,
        tuple(tuple(a) for a in chat.answers),
    )


def best(rounds: Sequence[ChatResult]) -> ChatResult:
    """Every time the least over ``rounds`` (the counts are the same in each)."""
    return dataclasses.replace(
        rounds[0],
        ttft_mean=min(r.ttft_mean for r in rounds),
        ttft_p50=min(r.ttft_p50 for r in rounds),
        wall=min(r.wall for r in rounds),
        manager_s=min(r.manager_s for r in rounds),
        forward_s=min(r.forward_s for r in rounds),
    )


def multi_turn(
    model: PreTrainedModel, backend: kv_api.Backend, args: argparse.Namespace
) -> tuple[ChatResult, ChatResult]:
    """The workload on an engine with reuse and on one without, waves alternating."""
    system = tokens(1, args.system)
    first = [system + tokens(100 + c, args.user) for c in range(args.conversations)]
    chats = [
        Chat(kv_engine.Engine(model, backend, TPB, max_running=args.conversations, reuse=reuse), list(first))
        for reuse in (True, False)
    ]
    for turn in range(args.turns):
        # The order alternates too, so neither side always runs first after the other.
        for chat in chats if turn % 2 == 0 else chats[::-1]:
            chat.turn(turn, args.user, args.new_tokens)
    out = (result(chats[0], args.new_tokens), result(chats[1], args.new_tokens))
    for chat in chats:
        chat.engine.close()
    return out


def full_attention_twin(model: PreTrainedModel) -> PreTrainedModel:
    """``model`` without its sliding window: the same architecture and weights, full attention
    on every layer (Mistral reads ``config.sliding_window`` for both its mask and kvcore's layout)."""
    config = copy.deepcopy(model.config)
    config.sliding_window = None
    model_class: Any = type(model)  # transformers' module methods are untyped
    twin: PreTrainedModel = model_class(config).eval().to(next(model.parameters()).dtype)
    twin.load_state_dict(model.state_dict())
    twin.generation_config.eos_token_id = None
    twin.set_attn_implementation("sdpa")
    return twin


@dataclass(frozen=True)
class Resident:
    window: int | None
    peak_pages: dict[int, int]  # per attention layer group
    page_bytes: dict[int, int]  # per attention layer group: its layers' key and value strides

    @property
    def bytes(self) -> int:
        return sum(n * self.page_bytes[g] for g, n in self.peak_pages.items())


def resident(model: PreTrainedModel, backend: kv_api.Backend, prompt: int, new_tokens: int) -> Resident:
    """The most page bytes one long generation held at a forward (counts, not times: one run)."""
    engine = kv_engine.Engine(model, backend, tokens_per_block=TPB)
    engine.generate([tokens(7, prompt)], max_new_tokens=new_tokens)
    m = engine.manager
    page_bytes = {
        g: sum(
            m.get_page_stride(lid, role) for lid, lg in engine.views.group_of.items() if lg == g for role in KV_ROLES
        )
        for g in engine.views.attention_groups
    }
    out = Resident(engine.layout.window, dict(engine.stats.peak_blocks), page_bytes)
    engine.close()
    return out


def warm_up(model: PreTrainedModel, backend: kv_api.Backend) -> None:
    """The first forwards of a model pay one-time costs (kernel selection, allocations)."""
    engine = kv_engine.Engine(model, backend, tokens_per_block=TPB)
    engine.generate([tokens(2, 40), tokens(3, 20)], max_new_tokens=4)
    engine.close()


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "-"


def report_chat(results: dict[tuple[str, str], tuple[ChatResult, ChatResult]]) -> None:
    print(
        "| backend | model | prefill tokens computed, reuse / none | x | mean TTFT (ms), reuse / none | x "
        "| p50 TTFT (ms), reuse / none | x | wall (s), reuse / none | x | same tokens | preemptions |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (backend, name), (r, n) in results.items():
        print(
            f"| {backend} | {name} | {r.prefill:,} / {n.prefill:,} | {ratio(r.prefill, n.prefill)} "
            f"| {r.ttft_mean * 1e3:.1f} / {n.ttft_mean * 1e3:.1f} | {ratio(r.ttft_mean, n.ttft_mean)} "
            f"| {r.ttft_p50 * 1e3:.1f} / {n.ttft_p50 * 1e3:.1f} | {ratio(r.ttft_p50, n.ttft_p50)} "
            f"| {r.wall:.2f} / {n.wall:.2f} | {ratio(r.wall, n.wall)} "
            f"| {'yes' if r.answers == n.answers else 'no'} | {r.preemptions} / {n.preemptions} |"
        )


def report_share(results: dict[tuple[str, str], tuple[ChatResult, ChatResult]]) -> None:
    print(
        "| backend | model | kvcore per step (us), reuse | forward per step (ms), reuse | manager share, reuse "
        "| kvcore per step (us), none | manager share, none |"
    )
    print("|---|---|---|---|---|---|---|")
    for (backend, name), (r, n) in results.items():
        print(
            f"| {backend} | {name} | {r.manager_s / r.steps * 1e6:,.0f} | {r.forward_s / r.steps * 1e3:.2f} "
            f"| {100 * r.share:.2f}% | {n.manager_s / n.steps * 1e6:,.0f} | {100 * n.share:.2f}% |"
        )
    backends = list(dict.fromkeys(b for b, _ in results))
    if len(backends) > 1:
        models = list(dict.fromkeys(m for _, m in results))
        base = backends[0]
        for other in backends[1:]:
            for name in models:
                r, o = results[(base, name)][0], results[(other, name)][0]
                print(f"{name}, reuse: time in kvcore {other} / {base} = {ratio(o.manager_s, r.manager_s)}x")


def report_resident(results: dict[str, tuple[Resident, Resident]], prompt: int, new_tokens: int) -> None:
    print("| backend | model | window | peak pages per request | page bytes | resident K/V bytes | x full |")
    print("|---|---|---|---|---|---|---|")
    for backend, (window, full) in results.items():
        for label, r in (("mistral", window), ("mistral, full attention", full)):
            pages = ", ".join(str(n) for _, n in sorted(r.peak_pages.items()))
            sizes = ", ".join(f"{b:,}" for _, b in sorted(r.page_bytes.items()))
            print(
                f"| {backend} | {label} | {r.window or '-'} | {pages} | {sizes} | {r.bytes:,} "
                f"| {ratio(r.bytes, full.bytes)} |"
            )
    print(
        f"(one request: a {prompt}-token prompt and {new_tokens} new tokens; full attention holds "
        f"ceil({prompt + new_tokens - 1} / {TPB}) = {-(-(prompt + new_tokens - 1) // TPB)} pages)"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", action="append", help="backends to measure (default: every installed one)")
    parser.add_argument("--models", default="llama,hybrid", help="tiny models of the multi-turn rows")
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--system", type=int, default=64, help="system prompt tokens")
    parser.add_argument("--user", type=int, default=16, help="tokens per user message")
    parser.add_argument("--new-tokens", type=int, default=16, help="tokens generated per turn")
    parser.add_argument("--long-prompt", type=int, default=64, help="prompt of the resident-memory generation")
    parser.add_argument("--long-new-tokens", type=int, default=192, help="new tokens of that generation")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--repeat", type=int, default=2, help="rounds; each time is the best of them")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    backends = args.backend or list(kv_api.available_backends())
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    models = {name: kv_engine.tiny_model(name, dtype=torch.float32) for name in names}
    mistral = kv_engine.tiny_model("mistral", dtype=torch.float32)
    twin = full_attention_twin(mistral)
    for model in [*models.values(), mistral, twin]:
        warm_up(model, kv_api.load_backend(backends[0]))

    # Rounds outside, backends inside: the machine's drift over the run falls on every backend.
    rounds: dict[tuple[str, str], list[tuple[ChatResult, ChatResult]]] = {}
    for _ in range(args.repeat):
        for backend_name in backends:
            for name, model in models.items():
                pair = multi_turn(model, kv_api.load_backend(backend_name), args)
                rounds.setdefault((backend_name, name), []).append(pair)
    chats = {k: (best([r for r, _ in v]), best([n for _, n in v])) for k, v in rounds.items()}
    pages = {
        b: (
            resident(mistral, kv_api.load_backend(b), args.long_prompt, args.long_new_tokens),
            resident(twin, kv_api.load_backend(b), args.long_prompt, args.long_new_tokens),
        )
        for b in backends
    }

    print(
        f"Reference engine: float32 tiny models, torch on {args.threads} thread(s), {TPB} tokens per block, "
        f"times the best of {args.repeat} rounds\n\n"
        f"Multi-turn chat: {args.conversations} conversations x {args.turns} turns, a {args.system}-token system "
        f"prompt, {args.user}-token user messages, {args.new_tokens} new tokens a turn; each turn's "
        f"{args.conversations} requests one generate call; with reuse against Engine(reuse=False)\n"
    )
    report_chat(chats)
    print("\nThe manager's share of an engine step, manager_s / (manager_s + forward_s), same runs\n")
    report_share(chats)
    print(
        f"\nResident page memory: one request, {args.long_prompt}-token prompt + {args.long_new_tokens} new tokens, "
        "mistral (sliding window on every layer) against its full-attention twin (same weights)\n"
    )
    report_resident(pages, args.long_prompt, args.long_new_tokens)


if __name__ == "__main__":
    main()
