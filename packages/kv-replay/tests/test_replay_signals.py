"""A replay stopped by SIGTERM ends as one stopped by Ctrl-C (SIGINT): one line (``kvcore:
terminated``, status 143; ``kvcore: interrupted``, 130), no traceback, and nothing left behind (no temporary directory, no disk-tier files),
with real processes killed mid-replay; and ``kvcore`` used as a library keeps its own handler."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import kv_api
from kv_replay import signals
from kv_replay.cli import main

# Blocks of 16 tokens and 8 KiB: the device holds 256, about 13 requests, so from the 14th request
# on every admission moves pages down to the host and on to disk. 10,000 requests of 300 tokens
# decode one at a time for two million steps, about 10 s on the native backend: far past the signal.
FLAGS = ["--quiet", "--layers", "1", "--tokens-per-block", "16", "--bytes-per-token", "256"]
TIERS = ["--quota", "2M", "--host-quota", "64K", "--disk-quota", "1M", "--max-in-flight", "1"]


@pytest.fixture(scope="module")
def long_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("trace") / "long.jsonl"
    lines = [{"tokens": list(range(100 * r, 100 * r + 100)), "output_length": 200} for r in range(10_000)]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


def _default_signals() -> None:
    # A child of a shell without job control starts ignoring SIGINT, and Python then installs no
    # KeyboardInterrupt handler: start it as a terminal would.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _holds_a_file_in(pid: int, directory: Path) -> bool:
    """The process has a file in ``directory`` open: the disk tier's pages, named or unlinked
    (``/proc`` shows ``DIR/#INODE (deleted)`` for an ``O_TMPFILE``)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith(f"{directory}{os.sep}"):
            return True
    return False


def _replay_until_mid_run(argv: list[str], env: dict[str, str], files: Path) -> subprocess.Popen[bytes]:
    child = subprocess.Popen(
        [sys.executable, "-m", "kv_replay.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        preexec_fn=_default_signals,
    )
    deadline = time.monotonic() + 60
    while not _holds_a_file_in(child.pid, files):  # its manager is built: the replay runs
        if child.poll() is not None or time.monotonic() > deadline:
            child.kill()
            _, err = child.communicate()
            pytest.fail(f"the replay did not start (status {child.returncode}): {err.decode()[-2000:]}")
        time.sleep(0.02)
    time.sleep(0.3)  # well into the replay: pages moving down to host and disk
    return child


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="watches the child's open files in /proc")
@pytest.mark.requires("host_tier", "disk_tier")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("mode", ["temporary-dir", "disk-path", "cluster"])
def test_a_signalled_replay_ends_as_interrupted_and_leaves_nothing(
    backend: kv_api.Backend, long_trace: Path, tmp_path: Path, signum: int, mode: str
) -> None:
    tmpdir, disk = tmp_path / "tmp", tmp_path / "disk"
    tmpdir.mkdir()
    disk.mkdir()
    argv = ["replay", str(long_trace), *FLAGS, *TIERS, "--backend", backend.name]
    if mode != "temporary-dir":
        argv += ["--disk-path", str(disk)]
    if mode == "cluster":
        argv += ["--instances", "2", "--router", "kv"]
    env = {**os.environ, "TMPDIR": str(tmpdir), "PYTHONPATH": os.pathsep.join(sys.path)}
    child = _replay_until_mid_run(argv, env, tmpdir if mode == "temporary-dir" else disk)
    sent = time.monotonic()
    child.send_signal(signum)
    try:
        out, err = child.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        child.kill()
        pytest.fail("the replay did not end within 30 s of the signal")
    assert time.monotonic() - sent < 10  # promptly: it stops between manager calls
    ended = (143, b"kvcore: terminated\n") if signum == signal.SIGTERM else (130, b"kvcore: interrupted\n")
    assert (child.returncode, out, err) == (ended[0], b"", ended[1])
    assert list(tmpdir.iterdir()) == [] and list(disk.iterdir()) == []  # no kvcore-replay-*, no pages


@pytest.fixture
def short_trace(tmp_path: Path) -> Path:
    path = tmp_path / "short.jsonl"
    path.write_text(json.dumps({"tokens": [1, 2, 3], "output_length": 2}) + "\n")
    return path


def test_as_a_library_the_previous_sigterm_handler_comes_back(
    capsys: pytest.CaptureFixture[str], short_trace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def mine(signum: int, frame: Any) -> None:
        pass

    installed: list[Any] = []
    real = signal.signal

    def spy(signum: int, handler: Any) -> Any:
        installed.append(handler)
        return real(signum, handler)

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        monkeypatch.setattr(signal, "signal", spy)  # the module kv_replay.signals calls through
        assert main(["replay", str(short_trace), *FLAGS, "--json"]) == 0
        assert installed[1:] == [mine] and installed[0] is not mine  # the replay's own during it, then back
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        real(signal.SIGTERM, previous)
    capsys.readouterr()


def test_an_ignored_sigterm_stays_ignored(capsys: pytest.CaptureFixture[str], short_trace: Path) -> None:
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with signals.terminate_as_interrupt():  # as Python leaves an ignored SIGINT ignored
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
        assert main(["replay", str(short_trace), *FLAGS, "--json"]) == 0
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous)
    capsys.readouterr()
