"""The pytest plugin behind the suite: backend selection, header, capability gates, known gaps,
hypothesis profiles.

- ``KV_BACKEND`` (or ``--kv-backend``) names the backends to test: one name, a comma list, or
  ``all`` (every installed backend that loads). Tests taking the ``backend`` fixture run once per
  backend; ``backends`` gives all of them at once (differential tests).
- ``@pytest.mark.requires("native_buffers")`` skips a test on backends whose ``Capabilities``
  lack that feature, naming it.
- Known gaps: ``known_gaps/<backend>.toml`` in this package, or the file named by
  ``--known-gaps``/``KV_KNOWN_GAPS`` (for backends outside this repository). Each entry names a
  test and a reason; the test is marked xfail (strict) on that backend. An entry matching no
  test is reported with a warning.
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
from collections.abc import Iterator
from dataclasses import fields
from importlib import resources
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

import kv_api
from kv_api.errors import BackendError, LogicError

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


def _load_gaps(config: pytest.Config, names: list[str]) -> dict[str, list[dict[str, str]]]:
    extra = config.getoption("--known-gaps") or os.environ.get("KV_KNOWN_GAPS")
    gaps: dict[str, list[dict[str, str]]] = {}
    for name in names:
        text = ""
        packaged = resources.files("kv_conformance") / "known_gaps" / f"{name}.toml"
        if packaged.is_file():
            text = packaged.read_text()
        entries = tomllib.loads(text).get("gap", []) if text else []
        if extra:
            entries += [
                e for e in tomllib.loads(Path(extra).read_text()).get("gap", []) if e.get("backend", name) == name
            ]
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


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> kv_api.Backend:
    """The backend under test (one per parametrization)."""
    b = kv_api.load_backend(request.param)
    for marker in request.node.iter_markers("requires"):
        for cap in marker.args:
            if not getattr(b.capabilities, cap):
                pytest.skip(f"backend {b.name!r} lacks capability {cap!r}")
    return b


@pytest.fixture
def backends(request: pytest.FixtureRequest) -> list[kv_api.Backend]:
    """Every backend under test, for differential tests."""
    return [kv_api.load_backend(n) for n in request.config.stash[_NAMES]]


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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    used: set[tuple[str, str]] = set()
    for item in items:
        callspec = getattr(item, "callspec", None)
        name = callspec.params.get("backend") if callspec else None
        if name is None:
            continue
        base = item.nodeid.split("[", 1)[0]
        for gap in config.stash[_GAPS].get(name, []):
            if base.endswith(gap["test"]):
                item.add_marker(pytest.mark.xfail(reason=f"known gap ({name}): {gap['reason']}", strict=True))
                used.add((name, gap["test"]))
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
