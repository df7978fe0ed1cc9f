"""The capability gates themselves (``kv_conformance.gates``, the plugin's ``requires`` marker and
known gaps, the fuzzer's runs, the differential machine's draws): a backend that declares less
gets skips, not failures, and the backends that declare more are still compared on the rest.

``bare`` is a throwaway backend: the Python backend's own copy, declaring no optional capability
and refusing each with ``NotImplementedError`` as a backend without them does. Gated tests of
every kind run on it beside ``py`` in a pytest subprocess (``KV_BACKEND=bare,py``)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

import kv_api
from kv_api import Capabilities
from kv_conformance import fuzz, gates
from kv_conformance.fuzz import cases as fuzz_cases
from kv_conformance.fuzz import worker as fuzz_worker

from . import test_manager_differential as differential

FULL = Capabilities(host_tier=True, disk_tier=True, ssm_layers=True, swa_scratch=True, batched_calls=True)
WEAK = Capabilities(swa_scratch=True)  # no tier, no SSM, no batched calls
NONE = Capabilities()


def fake(name: str, caps: Capabilities) -> SimpleNamespace:
    return SimpleNamespace(name=name, capabilities=caps)


def test_gates_read_the_declared_capabilities() -> None:
    full, weak = fake("full", FULL), fake("weak", WEAK)
    assert gates.declared(weak) == {"key_formats", "swa_scratch"}
    assert gates.having([weak, full], ["host_tier", "ssm_layers"]) == [full]
    assert gates.having([weak, full], []) == [weak, full]
    assert gates.lacking(weak, ["ssm_layers", "swa_scratch", "host_tier"]) == ["ssm_layers", "host_tier"]
    assert gates.common([weak, full]) == {"key_formats", "swa_scratch"}
    with pytest.raises(ValueError, match="unknown capabilities host_teir"):
        gates.having([full], ["host_teir"])


def test_the_differential_machine_draws_what_two_backends_share() -> None:
    full, other, weak = fake("full", FULL), fake("other", FULL), fake("weak", NONE)
    options: list[tuple[list[Any], Callable[[Any], list[str]], list[Any]]] = [
        (differential.TIERS, differential.tier_needs, ["device", "device"]),
        (differential.HYBRID, differential.hybrid_needs, ["attention", "attention"]),
        (differential.REWINDS, differential.rewind_needs, [None, None]),
    ]
    for drawn, needs_of, core in options:
        # Two capable backends: every option, as often as before; a weaker third takes nothing away.
        assert gates.shared_options(drawn, needs_of, [full, other]) == drawn
        assert gates.shared_options(drawn, needs_of, [weak, full, other]) == drawn
        # One capable backend beside a weaker one: nothing to compare it with, the core options only.
        assert gates.shared_options(drawn, needs_of, [weak, full]) == core
    # A configuration runs on the backends that have all it needs.
    needs = [*differential.tier_needs("host+disk"), *differential.hybrid_needs("ssm")]
    assert gates.having([weak, full, other], needs) == [full, other]


def test_the_fuzzer_runs_each_capability_on_the_backends_that_have_it(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, caps in (("full", FULL), ("other", FULL), ("weak", NONE)):
        monkeypatch.setitem(kv_api.registry._loaded, name, fake(name, caps))
    used = fuzz_cases.USED
    assert used == {"host_tier", "batched_calls"}
    assert fuzz.plan(["full", "other"]) == [(["full", "other"], used)]
    assert fuzz.plan(["full", "weak", "other"]) == [(["full", "other"], used), (["full", "weak", "other"], set())]
    batched = {f"{m.owner}.{m.name}" for m in fuzz_cases.members()} - {
        f"{m.owner}.{m.name}" for m in fuzz_cases.members(set())
    }
    assert batched == set(fuzz_cases.NEEDS)
    assert not any("_many(" in c.source and c.owner == "KVCacheManager" for c in fuzz.generate(300, 0, set()))
    # Backends alike fuzz the cases and fixture they always did.
    assert fuzz.generate(50, 3, used) == fuzz.generate(50, 3)
    assert len(fuzz_worker.fixture_config(set()).cache_tiers) == 1
    assert len(fuzz_worker.fixture_config(used).cache_tiers) == 2


BARE = '''
"""A backend declaring no optional capability: its own copy of the Python backend, refusing
what it does not declare."""
import importlib
import sys

from kv_api import (
    Capabilities, DiskCacheTierConfig, HostCacheTierConfig, KVCacheManagerConfig, RemoteCacheTierConfig, SsmLayerConfig
)
from kv_api.contract import BACKEND_ATTRIBUTES


def _private_copy(package):
    # Its own module objects, so its own poison latch and classes (docs/adding-a-backend.md).
    def mine():
        return [n for n in sys.modules if n == package or n.startswith(package + ".")]

    shared = {n: sys.modules.pop(n) for n in mine()}
    try:
        return importlib.import_module(package)
    finally:
        for n in mine():
            del sys.modules[n]
        sys.modules.update(shared)


_py = _private_copy("kv_core_py")
globals().update({a: getattr(_py, a) for a in BACKEND_ATTRIBUTES if hasattr(_py, a)})
name = "bare"
version = "0.0"
priority = -1
capabilities = Capabilities()


def build_info():
    return {"origin": "test_capability_gates", "sha256": "hashlib"}


class KVCacheManager(_py.KVCacheManager):
    def __init__(self, config, event_manager=None, page_copier=None):
        if isinstance(config, KVCacheManagerConfig):
            if any(
                isinstance(t, (HostCacheTierConfig, DiskCacheTierConfig, RemoteCacheTierConfig))
                for t in config.cache_tiers
            ):
                raise NotImplementedError("bare: no host, disk or remote tier")
            if config.commit_min_snapshot or any(isinstance(x, SsmLayerConfig) for x in config.layers):
                raise NotImplementedError("bare: no SSM layers")
            if config.swa_scratch_reuse is not None:
                raise NotImplementedError("bare: no SWA scratch reuse")
        super().__init__(config, event_manager, page_copier)

    def resize_many(self, caches, capacities):
        raise NotImplementedError("bare: no batched calls")

    def commit_many(self, caches, tokens, counts, is_end=False):
        raise NotImplementedError("bare: no batched calls")

    def admit_many(self, reuse_scopes, prompts, ids=None, priority_callbacks=None):
        raise NotImplementedError("bare: no batched calls")

    def decode_steps(self, caches, tokens, steps, until_room=None):
        raise NotImplementedError("bare: no batched calls")
'''


def load_bare(tmp_path: Path) -> Any:
    """``bare`` as a module of this process, not registered."""
    path = tmp_path / "bare_kv.py"
    path.write_text(textwrap.dedent(BARE))
    spec = importlib.util.spec_from_file_location("bare_kv_in_process", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compared_per_sequence(backends: list[Any], monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Run the differential machine briefly on ``backends``: the backends each sequence's
    configuration ran on (the machine's ``gates.having`` look-up, watched)."""
    seen: list[list[str]] = []
    real = gates.having

    def having(among: Any, needs: Any) -> Any:
        chosen = real(among, needs)
        seen.append([b.name for b in chosen])
        return chosen

    with monkeypatch.context() as patch:
        patch.setattr(gates, "having", having)
        machine = differential.make_machine(backends, [0])
        seen.clear()  # the options' look-ups, before any sequence
        quick = settings(max_examples=30, stateful_step_count=5, derandomize=True, database=None)
        run_state_machine_as_test(machine, settings=settings(quick, suppress_health_check=list(HealthCheck)))
    return seen


@pytest.mark.skipif(importlib.util.find_spec("kv_core_py") is None, reason="needs the Python backend to copy")
def test_the_differential_machine_compares_each_configuration_where_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``bare`` beside one capable backend: only configurations both take are drawn (none is
    rejected). Beside two (``py`` twice): configurations with tiers, SSM layers or scratch reuse
    are still drawn, and run on the capable two; the others on all three."""
    bare, py = load_bare(tmp_path), kv_api.load_backend("py")
    pair = compared_per_sequence([bare, py], monkeypatch)
    assert pair and all(names == ["bare", "py"] for names in pair), pair
    three = compared_per_sequence([bare, py, py], monkeypatch)
    assert ["py", "py"] in three and ["bare", "py", "py"] in three, three


#: Known gaps in bare's own package: one naming a test that compares backends.
OWN_GAPS = """
[[gap]]
test = "test_manager_many_life_cycles.py::test_six_life_cycles_backends_agree"
reason = "its own file"
"""
#: A --known-gaps file: an entry for bare only, not for py tested beside it.
GAPS = """
[[gap]]
backend = "bare"
test = "test_capabilities.py::test_build_info_is_text"
reason = "named by --known-gaps"
"""


def install_bare(site: Path) -> None:
    """``bare`` as an installed distribution (a package with its own ``known_gaps.toml``) in
    ``site`` (put it on ``PYTHONPATH``)."""
    info = site / "bare_kv-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: bare_kv\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{kv_api.ENTRY_POINT_GROUP}]\nbare = bare_kv\n")
    (site / "bare_kv").mkdir()
    (site / "bare_kv" / "__init__.py").write_text(textwrap.dedent(BARE))
    (site / "bare_kv" / "known_gaps.toml").write_text(OWN_GAPS)


#: Test -> its outcomes on ``KV_BACKEND=bare,py``: (outcome, words its message must hold).
EXPECTED: dict[str, tuple[str, str]] = {
    "tiers/test_levels.py::test_host_quota_granularity[bare-exact]": ("skipped", "'bare' lacks capability 'host_tier'"),
    "tiers/test_levels.py::test_host_quota_granularity[py-exact]": ("passed", ""),
    "tiers/test_levels.py::test_tier_layouts_are_accepted[bare-disk]": ("skipped", "lacks capability 'disk_tier'"),
    "tiers/test_reuse.py::test_a_private_window_page_is_released_once_stale[bare]": ("skipped", "host_tier"),
    "test_hybrid_snapshots.py::test_a_match_cut_to_nothing_holds_no_block[bare]": ("skipped", "ssm_layers"),
    "test_manager_stats_surface.py::test_ssm_snapshot_stats_same_on_both_backends": (
        "skipped",
        "needs two backends with ssm_layers: 'bare' lacks ssm_layers",
    ),
    "tiers/test_disk_differential.py::test_disk_faults_cost_misses_never_data": ("skipped", "'bare' lacks disk_tier"),
    "test_swa_scratch.py::test_setter[bare]": ("skipped", "swa_scratch"),
    "test_swa_scratch.py::test_backends_agree": ("skipped", "'bare' lacks swa_scratch"),
    "test_batched_calls.py::test_shut_down_manager[bare]": ("skipped", "batched_calls"),
    "test_batched_calls.py::test_shut_down_manager[py]": ("passed", ""),
    # Compared where they can be: without a host tier, the fuzzer's fixture and batched calls.
    "test_events_overflow.py::test_every_backend_resyncs_with_the_same_events": ("passed", ""),
    "test_manager_differential.py::test_backends_agree[0]": ("passed", ""),
    "test_fuzz.py::test_fuzz_finds_nothing_unknown[1]": ("passed", ""),
    # Known gaps of bare, one naming a test that compares backends: strict, so passing fails.
    "test_manager_many_life_cycles.py::test_six_life_cycles_backends_agree": ("failed", "(bare): its own file"),
    "test_capabilities.py::test_build_info_is_text[bare]": ("failed", "known gap (bare): named by --known-gaps"),
    "test_capabilities.py::test_build_info_is_text[py]": ("passed", ""),
}
if importlib.util.find_spec("kv_events") is not None:
    EXPECTED["test_events_wire.py::test_v1_hashes_are_refused[bare]"] = ("skipped", "wire_events")


def outcomes(junit: Path) -> dict[str, tuple[str, str]]:
    """``path.py::name`` (the path from this folder) -> (outcome, message) from a JUnit XML report."""
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        key = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        found = [
            (child.tag, child.get("message", "")) for child in case if child.tag in ("skipped", "failure", "error")
        ]
        tag, message = found[0] if found else ("passed", "")
        out[key] = ({"failure": "failed", "error": "error"}.get(tag, tag), message)
    return out


@pytest.mark.skipif(importlib.util.find_spec("kv_core_py") is None, reason="needs the Python backend to copy")
def test_a_backend_without_capabilities_gets_skips_not_failures(tmp_path: Path) -> None:
    site = tmp_path / "site"
    install_bare(site)
    gaps = tmp_path / "gaps.toml"
    gaps.write_text(GAPS)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # none of the checkout's configuration
    here = Path(__file__).parent
    ids = sorted({str(here / key.split("[")[0]) + key[len(key.split("[")[0]) :] for key in EXPECTED})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "KV_"))}
    env.update(
        KV_BACKEND="bare,py",
        KV_DIFFERENTIAL_EXAMPLES="25",
        PYTHONPATH=os.pathsep.join([str(site), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    )
    junit = tmp_path / "junit.xml"
    # Rooted here, so that node ids read file.py::name, as known gaps name them.
    args = ["-p", "no:cacheprovider", "-q", "--rootdir", str(here), "-c", str(tmp_path / "pytest.ini")]
    args += ["--known-gaps", str(gaps), f"--junitxml={junit}", *ids]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert junit.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    got = outcomes(junit)
    wrong = [
        f"{key}: expected {outcome} ({words}), got {got.get(key, 'nothing')}"
        for key, (outcome, words) in EXPECTED.items()
        if key not in got or got[key][0] != outcome or words not in got[key][1]
    ]
    assert not wrong, "\n".join([*wrong, run.stdout[-3000:]])
