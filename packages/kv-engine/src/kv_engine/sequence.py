"""One request's state in the engine, and what ``generate`` returns for it."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

import kv_api


@dataclass(frozen=True)
class Output:
    """A finished request: ``tokens`` generated (greedy); ``reused_tokens``, prompt tokens kvcore
    held when the request was admitted (not recomputed); ``preemptions``, times it was preempted;
    ``reused_by_level``, those reused tokens per cache level they were found on (0: device);
    ``logits``, the logits each token was sampled from (kept only with ``keep_logits``);
    ``ttft_s`` and ``latency_s``, seconds from the ``generate`` call to its first and last token."""

    tokens: list[int]
    reused_tokens: int
    preemptions: int = 0
    reused_by_level: tuple[int, ...] = ()
    logits: tuple[torch.Tensor, ...] = ()
    ttft_s: float = 0.0
    latency_s: float = 0.0


@dataclass
class Sequence:
    """A request: ``tokens`` is the prompt followed by what was generated so far.

    ``computed`` (H) tokens have their K/V (and state) in kvcore's pages; ``committed`` of them
    were committed. The last generated token is computed by the next forward, so a running
    request always has ``computed < len(tokens)``.
    """

    index: int
    prompt_length: int
    tokens: list[int]
    scope: kv_api.ReuseScope | None
    max_new_tokens: int
    cache: kv_api.KVCache | None = None
    #: Per attention layer group, the cache's base page indices: int32 tensors kvcore keeps
    #: current (``set_base_page_index_buf``) through commits (rebase), resizes and resumes.
    slots: dict[int, torch.Tensor] = field(default_factory=dict)
    computed: int = 0
    committed: int = 0
    #: (reused tokens, per level) of the cache created last; ``reused_tokens`` and
    #: ``reused_by_level`` take them when the request first runs.
    admitted: tuple[int, tuple[int, ...]] = (0, ())
    reused_tokens: int | None = None
    reused_by_level: tuple[int, ...] = ()
    preemptions: int = 0
    logits: list[torch.Tensor] = field(default_factory=list)
    ttft_s: float = 0.0
    latency_s: float = 0.0

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.prompt_length :]

    @property
    def finished(self) -> bool:
        return len(self.tokens) - self.prompt_length >= self.max_new_tokens

    @property
    def uncommitted(self) -> list[int]:
        """Computed tokens not committed yet."""
        return self.tokens[self.committed : self.computed]

    def output(self) -> Output:
        return Output(
            self.generated,
            self.reused_tokens or 0,
            self.preemptions,
            self.reused_by_level,
            tuple(self.logits),
            self.ttft_s,
            self.latency_s,
        )
