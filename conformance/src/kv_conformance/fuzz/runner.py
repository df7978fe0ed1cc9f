"""Runs fuzz cases in a worker subprocess and turns their outcomes into findings.

Kinds of finding: ``crash`` (the worker died of a signal, or exited), ``hang`` (a case ran past
the time limit), ``class`` (the backends disagree on whether a call raises, or on the class),
``message`` (same class, different message, on a member whose messages the contract fixes),
``value`` (same success, different result or a different state afterwards) and ``state`` (a
call that raised left the fixture's observable state changed). The first backend is the
reference the others are compared with.

Capabilities: a run uses only those it is given (the fixture's host tier, the batched calls);
``plan`` splits backends that differ in them into runs, so each capability is fuzzed on every
backend that has it.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import kv_api
from kv_conformance import gates
from kv_conformance.fuzz.cases import OPAQUE, USED, Case
from kv_conformance.fuzz.known import KNOWN, Known, pinned

KINDS = ("crash", "hang", "class", "message", "value", "state")
#: Members whose error messages the contract fixes (docs/errors.md: the binding's message
#: table mirrors kv_api's wording): every member test_manager_bad_arguments.py and
#: test_keys_errors.py compare messages of, and the constructors and clear/shutdown.
MESSAGES_FIXED = {
    *(
        f"KVCacheManager.{name}"
        for name in (
            "__init__",
            "get_layer_group_id",
            "get_page_stride",
            "get_page_index_converter",
            "get_page_index_upper_bound",
            "get_mem_pool_base_address",
            "pool_memory",
            "get_storage_statistics",
            "get_quota",
            "probe_reuse",
            "probe_first_new_block_key",
            "create_kv_cache",
            "clear_reusable_blocks",
            "shutdown",
        )
    ),
    *(
        f"KVCache.{name}"
        for name in (
            "resize",
            "commit",
            "capacity",
            "history_length",
            "get_base_page_indices",
            "get_aggregated_page_indices",
            "set_base_page_index_buf",
        )
    ),
    "KVCacheEventManager.__init__",
    *(
        f"Backend.{name}"
        for name in (
            "block_keys",
            "sequence_to_blockchain_keys",
            "reuse_scope_to_bytes",
            "cache_salt_to_id",
            "block_hash_v2_sha256",
            "block_hash_v2_sha256_64",
            "block_hash_v1",
            "gen_multimodal_cache_key_tokens",
        )
    ),
}


@dataclass
class Finding:
    kind: str
    case: Case
    outcomes: list[str]  # one line per backend (outcome_text), or why there is none
    extra: str = ""
    known: Known | None = None

    def format(self) -> str:
        tag = f" (known: {self.known.reason})" if self.known else ""
        detail = "\n".join([*self.outcomes, *([self.extra] if self.extra else [])])
        return f"[{self.kind}] {self.case.source}{tag}\n    " + detail.replace("\n", "\n    ")

    @property
    def signature(self) -> tuple[str, str, str]:
        """Findings alike but for numbers: one root cause, most likely."""
        first_lines = " | ".join(o.splitlines()[0] for o in self.outcomes)
        return self.kind, self.case.call, re.sub(r"\d+", "#", first_lines)


@dataclass
class Report:
    backends: list[str]
    #: The capabilities the run used (None: those every backend declares).
    capabilities: frozenset[str] | None = None
    cases: int = 0
    seconds: float = 0.0
    findings: list[Finding] = field(default_factory=list)
    #: Known divergences whose example no longer shows them: the fix landed, remove the entry.
    stale: list[Known] = field(default_factory=list)

    @property
    def unknown(self) -> list[Finding]:
        return [f for f in self.findings if f.known is None]

    def counts(self) -> dict[str, int]:
        by_kind = Counter(f.kind for f in self.findings)
        return {k: by_kind[k] for k in KINDS}

    def summary(self) -> str:
        per_1000 = 1000 * self.seconds / max(self.cases, 1)
        counts = ", ".join(f"{k} {n}" for k, n in self.counts().items())
        known = len(self.findings) - len(self.unknown)
        left_out = sorted(USED - self.capabilities) if self.capabilities is not None else []
        without = f" (without {', '.join(left_out)})" if left_out else ""
        return (
            f"fuzz on {', '.join(self.backends)}{without}: {self.cases} cases in {self.seconds:.1f} s "
            f"({per_1000:.2f} s per 1000); findings: {counts} ({known} known, {len(self.unknown)} new)"
        )

    def format(self, limit: int = 50) -> str:
        """The summary, then one example of each distinct new finding (how often it showed)."""
        groups: dict[tuple[str, str, str], list[Finding]] = {}
        for f in self.unknown:
            groups.setdefault(f.signature, []).append(f)
        lines = [self.summary(), f"{len(groups)} distinct new findings"]
        for same in list(groups.values())[:limit]:
            lines.append(f"({len(same)}x) {same[0].format()}")
        if len(groups) > limit:
            lines.append(f"... and {len(groups) - limit} more")
        lines += [f"stale known divergence (no longer occurs, remove it): {k.example}" for k in self.stale]
        lines.append("reproduce one: python -m kv_conformance.fuzz --repro '<case>'")
        return "\n".join(lines)


class Worker:
    """A ``kv_conformance.fuzz.worker`` subprocess for ``backends``, its fixture using
    ``capabilities`` (default: those every backend declares)."""

    def __init__(self, backends: list[str], capabilities: Collection[str] | None = None) -> None:
        self.backends = backends
        # Append mode: the worker writes at the end whatever offset the tail was read at (one shared offset).
        self.stderr: IO[bytes] = tempfile.TemporaryFile(mode="a+b")
        flags = [] if capabilities is None else [f"--capabilities={','.join(sorted(capabilities))}"]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "kv_conformance.fuzz.worker", *flags, *backends],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
        )
        first = self._read(60.0)
        if first is None:
            raise RuntimeError(f"the fuzz worker did not start:\n{self.stderr_tail()}")
        self.baselines: dict[str, str] = json.loads(first)

    def _read(self, timeout: float) -> bytes | None:
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        if not ready:
            return None
        line = self.process.stdout.readline()
        return line or None

    def run(self, case: Case, timeout: float) -> list[dict[str, Any]] | str:
        """The outcomes, or why there are none ("crash: ..." / "hang: ...")."""
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps({"source": case.source, "op": case.op}).encode() + b"\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            pass
        line = self._read(timeout)
        if line is not None:
            outcomes: list[dict[str, Any]] = json.loads(line)
            return outcomes
        if self.process.poll() is None:
            tail = self.stderr_tail()
            self.close()
            return f"hang: no answer within {timeout:g} s\n{tail}"
        code = self.process.wait()
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        return f"crash: the worker died ({how})\n{self.stderr_tail()}"

    def stderr_tail(self, lines: int = 12) -> str:
        self.stderr.seek(0, os.SEEK_END)
        size = self.stderr.tell()
        self.stderr.seek(max(0, size - 8192))
        return "\n".join(self.stderr.read().decode(errors="replace").splitlines()[-lines:])

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()
        self.stderr.close()


def first_difference(a: str, b: str, context: int = 60) -> str:
    i = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    start = max(0, i - context)
    return f"...{a[start : i + context]}...\n  vs ...{b[start : i + context]}..."


def outcome_text(o: dict[str, Any]) -> str:
    return f"{o['backend']}: " + (f"raised {o['raised']}: {o['message']}" if o["raised"] else f"-> {o['value']}")


def classify(case: Case, outcomes: list[dict[str, Any]], baselines: dict[str, str]) -> list[Finding]:
    findings = []
    for o in outcomes:
        if o["raised"] and o["state"] != baselines[o["backend"]]:
            diff = first_difference(baselines[o["backend"]], o["state"])
            findings.append(Finding("state", case, [outcome_text(o)], f"state before/after: {diff}"))
    ref = outcomes[0]
    for o in outcomes[1:]:
        both = [outcome_text(ref), outcome_text(o)]
        if ref["raised"] != o["raised"]:
            findings.append(Finding("class", case, both))
        elif ref["raised"]:
            if ref["message"] != o["message"] and case.exact and case.call in MESSAGES_FIXED:
                findings.append(Finding("message", case, both))
        elif ref["value"] != o["value"] and case.call not in OPAQUE:
            findings.append(Finding("value", case, both))
        elif ref["state"] != o["state"]:
            findings.append(Finding("value", case, both, f"state after: {first_difference(ref['state'], o['state'])}"))
    return findings


def attribute(backends: list[str], case: Case, timeout: float, capabilities: Collection[str] | None = None) -> str:
    """Which backends crash or hang on ``case`` alone (each in a fresh worker, on the run's fixture)."""
    culprits = []
    for name in backends:
        worker = Worker([name], capabilities)
        result = worker.run(case, timeout)
        worker.close()
        if isinstance(result, str):
            culprits.append(f"{name} ({result.split(':', 1)[0]})")
    return f"alone: {', '.join(culprits) or 'none (needs the other backend first)'}"


def run(
    backends: list[str],
    cases: Iterable[Case],
    *,
    timeout: float = 5.0,
    known: list[Known] = KNOWN,
    with_pinned: bool = True,
    capabilities: Collection[str] | None = None,
) -> Report:
    """Run ``cases`` (and each known divergence's example, if ``with_pinned``) on ``backends``,
    the fixture using ``capabilities`` (default: those every backend declares; the cases should
    be ``generate``'s for the same)."""
    caps = None if capabilities is None else frozenset(capabilities)
    report = Report(list(backends), caps)
    examples = pinned(known, backends) if with_pinned else []
    start = time.perf_counter()
    worker = Worker(report.backends, caps)
    try:
        for case in [*examples, *cases]:
            result = worker.run(case, timeout)
            if isinstance(result, str):
                kind, why = result.split(": ", 1)
                worker.close()
                found = [Finding(kind, case, [why])]
                worker = Worker(report.backends, caps)
            else:
                found = classify(case, result, worker.baselines)
            for f in found:
                f.known = next((k for k in known if k.matches(f.kind, f.case)), None)
                if f.kind in ("crash", "hang") and f.known is None:
                    f.extra = attribute(report.backends, case, timeout, caps)
            report.findings += found
            report.cases += 1
    finally:
        worker.close()
    report.seconds = time.perf_counter() - start
    if with_pinned:
        shown = {(f.case.source, f.kind) for f in report.findings}
        report.stale = [
            k for k in known if k.applies(backends) and not any((k.example, kind) in shown for kind in k.kinds)
        ]
    return report


def plan(backends: Sequence[str]) -> list[tuple[list[str], frozenset[str]]]:
    """The runs that fuzz ``backends`` (names, the first the reference), each with the
    capabilities it uses: one per set of the fuzzer's capabilities (``cases.USED``) that a backend
    declares, the largest first, on every backend that declares it all. Backends alike in those
    are one run; a backend with fewer is fuzzed with the others on what it has, and the others
    still among themselves on the rest."""
    loaded = [kv_api.load_backend(name) for name in backends]
    sets = sorted({gates.declared(b) & USED for b in loaded}, key=lambda caps: (-len(caps), sorted(caps)))
    return [([b.name for b in gates.having(loaded, caps)], caps) for caps in sets]
