"""The pytest plugin behind the suite: backend selection, header, capability gates, known gaps,
hypothesis profiles.

- ``KV_BACKEND`` (or ``--kv-backend``) names the backends to test: one name, a comma list, or
  ``all`` (every installed backend that loads). Tests taking the ``backend`` fixture run once per
  backend; ``backends`` gives all of them at once (differential tests).
- ``@pytest.mark.requires("host_tier", ...)`` (``kv_api.Capabilities`` field names) gates a test
  on capabilities. With ``backend``, the test is skipped on a backend that lacks one, naming it.
  With ``backends``, it gets the backends that have them all; it is skipped, naming who lacks
  what, when none has them, or when two or more backends are under test but fewer than two have
  them (a comparison needs a pair). Tests that gate part of their work on capabilities use
  ``kv_conformance.gates``.
- Known gaps: ``known_gaps/<backend>.toml`` in this package, the backend's own
  ``known_gaps.toml`` (package data of the backend's package), and the file named by
  ``--known-gaps``/``KV_KNOWN_GAPS``. An entry with ``backend = "name"`` is that backend's only;
  without, it is the file's backend's, or for ``--known-gaps`` every tested backend's (unless
  that file is a tested backend's own). Each entry names a test (``file.py::name``, any
  parametrization) and a reason; the test is marked xfail (strict) where that backend is
  tested: on its own case of a ``backend`` test, on a ``backends`` test whose backends (the
  capability gate's, as above) include it, and on any other test whenever it is under test. An
  entry matching no test is reported with a warning.
- Hypothesis profiles: ``dev`` (default) and ``ci`` (derandomized; the default when ``CI`` is
  set); ``KV_HYPOTHESIS_PROFILE`` or hypothesis' own ``--hypothesis-profile`` choose.
- A test that leaves a backend's poison latch set fails, and the latch is taken back.
- ``KV_DIFFERENTIAL_EXAMPLES``: how many sequences the differential state machine runs (in
  shards); the terminal summary says how many ran, over every xdist worker.
"""

from __future__ import annotations

import gc
import os
import tomllib
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import fields
from importlib import resources
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

import kv_api
from kv_api.errors import BackendError, LogicError
from kv_conformance import gates

# The backend fixture is a module handle: sharing it across examples is intended.
_SHARED_FIXTURES = [HealthCheck.function_scoped_fixture]
settings.register_profile("dev", max_examples=40, deadline=None, suppress_health_check=_SHARED_FIXTURES)
settings.register_profile(
    "ci",
    max_examples=60,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[*_SHARED_FIXTURES, HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("KV_HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))

ENV_VARS = ("KV_BACKEND", "KV_KNOWN_GAPS", "KV_HYPOTHESIS_PROFILE", "KV_DIFFERENTIAL_EXAMPLES", "KVCORE_SHA256", "CI")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kv-conformance")
    group.addoption(
        "--kv-backend", default=None, help="backends to test: name, comma list or 'all' (default: $KV_BACKEND)"
    )
    group.addoption("--known-gaps", default=None, help="a known-gaps TOML file for a backend outside this suite")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "requires(*capabilities): run only on backends that have these capabilities")
    spec = config.getoption("--kv-backend") or os.environ.get("KV_BACKEND", "")
    try:
        names = _selected(spec)
    except BackendError as exc:
        raise pytest.UsageError(str(exc)) from exc
    config.stash[_NAMES] = names
    config.stash[_GAPS] = _load_gaps(config, names)
    config.pluginmanager.register(_SequenceCounter(), "kv-sequence-counter")


_NAMES = pytest.StashKey[list[str]]()
_GAPS = pytest.StashKey[dict[str, list[dict[str, str]]]]()


def _selected(spec: str) -> list[str]:
    spec = spec.strip()
    if spec == "all":
        names = list(kv_api.available_backends())
        broken = [n for n in kv_api.installed_backends() if n not in names]
        for n in broken:  # load_backend raises with the reason
            kv_api.load_backend(n)
        return names
    names = [n.strip() for n in spec.split(",") if n.strip()] or [kv_api.default_backend_name()]
    for n in names:
        kv_api.load_backend(n)
    return names


def _own_gaps(name: str) -> str:
    """The text of the backend's own ``known_gaps.toml`` (package data beside its
    ``__init__``), or "" if it has none."""
    spec = getattr(kv_api.load_backend(name), "__spec__", None)
    if spec is None or not spec.submodule_search_locations:  # a plain module: no package data
        return ""
    own = resources.files(spec.name) / "known_gaps.toml"
    return own.read_text() if own.is_file() else ""


def _load_gaps(config: pytest.Config, names: list[str]) -> dict[str, list[dict[str, str]]]:
    extra = config.getoption("--known-gaps") or os.environ.get("KV_KNOWN_GAPS")
    extra_text = Path(extra).read_text() if extra else ""
    own = {name: _own_gaps(name) for name in names}
    if extra_text in [text for text in own.values() if text]:
        extra_text = ""  # a backend's own file, named by --known-gaps too: still its own only
    gaps: dict[str, list[dict[str, str]]] = {}
    for name in names:
        packaged = resources.files("kv_conformance") / "known_gaps" / f"{name}.toml"
        texts = [packaged.read_text() if packaged.is_file() else "", own[name], extra_text]
        entries: list[dict[str, str]] = []
        for text in texts:
            entries += [e for e in tomllib.loads(text).get("gap", []) if e.get("backend", name) == name]
        for e in entries:
            if not e.get("test") or not e.get("reason"):
                raise pytest.UsageError(f"known gap for {name!r} needs both 'test' and 'reason': {e}")
        gaps[name] = entries
    return gaps


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = []
    for name in config.stash[_NAMES]:
        b = kv_api.load_backend(name)
        info = ", ".join(f"{k}={v}" for k, v in b.build_info().items())
        lines.append(f"kv backend {name} {b.version}: {info}")
        caps = ", ".join(f"{f.name}={getattr(b.capabilities, f.name)}" for f in fields(b.capabilities))
        lines.append(f"  capabilities: {caps}")
    env = ", ".join(f"{k}={os.environ[k]}" for k in ENV_VARS if k in os.environ)
    lines.append(f"kv environment: {env or '(none set)'}; hypothesis profile: {settings._current_profile}")
    return lines


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames:
        names = metafunc.config.stash[_NAMES]
        metafunc.parametrize("backend", names, indirect=True, ids=names)


def _required(markers: Iterable[pytest.Mark]) -> list[str]:
    """The capabilities ``requires`` markers name (``node.iter_markers("requires")``: closest first)."""
    return list(dict.fromkeys(cap for marker in markers for cap in marker.args))


def _compared(names: list[str], needs: list[str]) -> tuple[list[kv_api.Backend], str | None]:
    """The backends a ``backends`` test gets, and why it is skipped instead (None: it runs)."""
    selected = [kv_api.load_backend(n) for n in names]
    chosen = gates.having(selected, needs)
    if len(chosen) >= min(2, len(selected)):
        return chosen, None
    lack = "; ".join(f"{b.name!r} lacks {', '.join(gates.lacking(b, needs))}" for b in selected if b not in chosen)
    pair = "two backends" if len(selected) > 1 else "a backend"
    return chosen, f"needs {pair} with {', '.join(needs)}: {lack}"


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> kv_api.Backend:
    """The backend under test (one per parametrization)."""
    b = kv_api.load_backend(request.param)
    for cap in gates.lacking(b, _required(request.node.iter_markers("requires")))[:1]:
        pytest.skip(f"backend {b.name!r} lacks capability {cap!r}")
    return b


@pytest.fixture
def backends(request: pytest.FixtureRequest) -> list[kv_api.Backend]:
    """Every backend under test that has the capabilities the test requires, for differential
    tests (skipped as the module docstring says)."""
    chosen, skip = _compared(request.config.stash[_NAMES], _required(request.node.iter_markers("requires")))
    if skip is not None:
        pytest.skip(skip)
    return chosen


@pytest.fixture(autouse=True)
def _no_poison_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fails a test that leaves a backend poisoned (docs/errors.md, "The poison latch") and takes
    the poison back, so that the tests after it in this worker run on a clean backend."""
    yield
    left = {}
    for name in request.config.stash[_NAMES]:
        reason = kv_api.load_backend(name).poison_reason()
        if reason is not None:
            left[name] = reason
    if not left:
        return
    gc.collect()  # the test's managers, which may sit in reference cycles
    kept = []
    for name in left:
        try:
            kv_api.load_backend(name).take_poison()
        except LogicError:  # a manager outlives the test: the latch stays, and later tests fail too
            kept.append(name)
    detail = ", ".join(f"{name}: {reason!r}" for name, reason in left.items())
    pytest.fail(f"the test left a backend poisoned ({detail}); still poisoned: {', '.join(kept) or 'none'}")


def _tested(item: pytest.Item, names: list[str]) -> list[str]:
    """The backends ``item`` tests: its ``backend`` parameter, the backends the ``backends``
    fixture gives it, or else every backend under test."""
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "backend" in callspec.params:
        return [callspec.params["backend"]]
    if "backends" in getattr(item, "fixturenames", ()):
        return [b.name for b in _compared(names, _required(item.iter_markers("requires")))[0]]
    return names


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    used: set[tuple[str, str]] = set()
    for item in items:
        base = item.nodeid.split("[", 1)[0]
        # Outside the rootdir (--pyargs from elsewhere) a node id has no file: name it here.
        bases = (base, "::".join([item.path.name, *base.split("::")[1:]]))
        reasons = []
        for name in _tested(item, config.stash[_NAMES]):
            for gap in config.stash[_GAPS].get(name, []):
                if any(b.endswith(gap["test"]) for b in bases):
                    reasons.append(f"known gap ({name}): {gap['reason']}")
                    used.add((name, gap["test"]))
        if reasons:  # one marker: strict, so the test must fail while any of these gaps stays
            item.add_marker(pytest.mark.xfail(reason="; ".join(reasons), strict=True))
    for name, entries in config.stash[_GAPS].items():
        for gap in entries:
            if (name, gap["test"]) not in used:
                warnings.warn(f"known gap for {name!r} matches no test: {gap['test']}", stacklevel=1)


class _SequenceCounter:
    """Adds up the differential state machine's sequences: each shard reports its count as a user
    property, which xdist carries from its workers to this process."""

    def __init__(self) -> None:
        self.counts: list[int] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call":
            self.counts += [
                v for k, v in report.user_properties if k == "kv_differential_sequences" and isinstance(v, int)
            ]

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.counts:
            terminalreporter.write_line(
                f"differential state machine: {sum(self.counts)} sequences in {len(self.counts)} shard(s)"
            )
