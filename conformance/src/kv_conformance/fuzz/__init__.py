"""A fuzzer for the backend contract (docs/fuzzing.md): every public member, adversarial
arguments, the same case on every backend's identical fixture, outcomes compared, failing calls
checked to change nothing, native crashes contained in a worker subprocess; capabilities a
backend does not declare are left out of its runs (``plan``)."""

from kv_conformance.fuzz.cases import Case, generate
from kv_conformance.fuzz.known import KNOWN, Known
from kv_conformance.fuzz.runner import KINDS, Finding, Report, plan, run

__all__ = ["KINDS", "KNOWN", "Case", "Finding", "Known", "Report", "generate", "plan", "run"]
