"""Known divergences: findings the fuzzer expects until their fix lands, each naming the call,
the kind of finding, the arguments that show it (a regular expression over the case's source)
and why. Each entry's ``example`` runs in every fuzz run, so an entry whose example no longer
diverges is reported as stale: remove it, the list only shrinks."""

from __future__ import annotations

import re
from dataclasses import dataclass

from kv_conformance.fuzz.cases import Case


@dataclass(frozen=True)
class Known:
    calls: tuple[str, ...]  # "<contract>.<member>", as Case.call
    kinds: tuple[str, ...]  # runner.KINDS entries
    pattern: str  # searched in the case's source
    example: str  # a case showing it, run every time
    reason: str
    #: The backends it shows on: both for a comparison, the faulty one for a crash or hang.
    needs: tuple[str, ...] = ("py", "cpp")

    def matches(self, kind: str, case: Case) -> bool:
        return kind in self.kinds and case.call in self.calls and re.search(self.pattern, case.source) is not None

    def applies(self, backends: list[str]) -> bool:
        return all(name in backends for name in self.needs)


# Empty since issue 10's fixes: a new divergence is a finding until it is fixed or listed here.
KNOWN: list[Known] = []


def pinned(known: list[Known], backends: list[str]) -> list[Case]:
    """The examples of the entries that can show on ``backends``, as cases."""
    return [Case.parse(k.example) for k in known if k.applies(backends)]
