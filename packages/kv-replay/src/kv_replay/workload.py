"""The embedded default workload: multi-turn chat sessions sharing system prompts across two
tenants, plus long documents read by several requests. Deterministic for a seed."""

from __future__ import annotations

import numpy as np

from kv_api import ReuseScope
from kv_api.keys import cache_salt_to_id
from kv_replay.trace import Request, synthetic_tokens

SYSTEM_PROMPTS = 4
SESSIONS = 48
DOCUMENTS = 4
READERS_PER_DOCUMENT = 4


def default_workload(seed: int = 0) -> list[Request]:
    rng = np.random.default_rng(seed)
    tenants = [ReuseScope(salt=cache_salt_to_id(name)) for name in ("tenant-a", "tenant-b")]
    systems = [synthetic_tokens(seed, int(rng.integers(800, 2000)), stream=100 + i) for i in range(SYSTEM_PROMPTS)]
    stream = 1000
    turns: list[list[Request]] = []
    for s in range(SESSIONS):
        history = systems[s % SYSTEM_PROMPTS]
        scope = tenants[s % len(tenants)]
        session = []
        for t in range(int(rng.integers(2, 6))):
            stream += 1
            user = synthetic_tokens(seed, int(rng.integers(40, 400)), stream=stream)
            prompt = np.concatenate([history, user])
            output = synthetic_tokens(seed, int(rng.integers(16, 64)), stream=stream + 500_000)
            session.append(Request(prompt, output, scope, name=f"session {s} turn {t}"))
            history = np.concatenate([prompt, output])  # the next turn continues the conversation
        turns.append(session)
    documents = []
    for d in range(DOCUMENTS):
        text = synthetic_tokens(seed, int(rng.integers(6000, 14000)), stream=200 + d)
        for r in range(READERS_PER_DOCUMENT):
            stream += 1
            question = synthetic_tokens(seed, int(rng.integers(20, 80)), stream=stream)
            output = synthetic_tokens(seed, int(rng.integers(32, 96)), stream=stream + 500_000)
            documents.append(Request(np.concatenate([text, question]), output, None, name=f"document {d} reader {r}"))
    # Sessions advance turn by turn, interleaved; document readers arrive spread among them.
    order: list[Request] = []
    depth = max(len(t) for t in turns)
    for t in range(depth):
        order.extend(session[t] for session in turns if t < len(session))
        order.extend(documents[t::depth])
    for i, request in enumerate(order):
        request.arrival = float(i)
    return order
