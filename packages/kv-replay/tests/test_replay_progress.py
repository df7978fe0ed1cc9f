"""The progress bar: requests done, their rate and the time left, on stderr; drawn on a terminal
or when asked (``--progress``), never into a pipe or a test's capture otherwise, never with
``--quiet``."""

from __future__ import annotations

import fcntl
import io
import json
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time

import pytest

import kv_api
from kv_replay.cli import main
from kv_replay.progress import ProgressBar

FAST = ["--limit", "20", "--layers", "1", "--tokens-per-block", "16", "--bytes-per-token", "64", "--quota", "4M"]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_bar_draws_the_count_its_rate_and_the_time_left() -> None:
    stream = Terminal()
    with ProgressBar("replay (x, 4M)", stream=stream) as bar:
        assert bar.callback is not None
        for done in range(4):
            bar.callback(done, 3)
            time.sleep(0.11)  # past the redraw interval: each count is drawn
    text = stream.getvalue()
    last = text.split("\r")[-1]
    assert last.startswith("replay (x, 4M): 100%") and last.endswith("\n")  # the line ends with the bar
    assert " 3/3 [" in last and " requests/s]" in last
    assert "<00:00" in text.split("\r")[-2]  # elapsed<left, while requests were left


def test_no_bar_where_it_is_not_shown() -> None:
    assert ProgressBar("x", stream=io.StringIO()).callback is None  # not a terminal
    assert ProgressBar("x", stream=Terminal(), quiet=True).callback is None
    forced = io.StringIO()
    with ProgressBar("x", stream=forced, forced=True) as bar:
        assert bar.callback is not None
        bar.callback(1, 1)
    assert "1/1" in forced.getvalue()


def test_progress_asks_for_the_bar_on_stderr_only(capsys: pytest.CaptureFixture[str], backend: kv_api.Backend) -> None:
    assert main(["replay", "--backend", backend.name, *FAST, "--json", "--progress"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["requests"] == 20  # stdout stays JSON
    assert f"replay ({backend.name}, 4M): 100%" in err and "20/20" in err and "requests/s" in err
    assert main(["replay", "--backend", backend.name, *FAST, "--json"]) == 0
    assert capsys.readouterr().err == ""  # stderr is not a terminal here: no bar unless asked


def _on_a_terminal(argv: list[str], columns: int) -> tuple[bytes, str]:
    """``kvcore`` with stderr on a pseudo-terminal of ``columns`` (0: one that reports no size);
    its stdout, and what the terminal showed."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24 if columns else 0, columns, 0, 0))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen(
        [sys.executable, "-m", "kv_replay.cli", *argv], stdout=subprocess.PIPE, stderr=follower, env=env
    )
    os.close(follower)
    shown = b""
    while True:
        ready, _, _ = select.select([leader], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(leader, 1 << 16)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            shown += chunk
        elif child.poll() is not None:
            break
    assert child.stdout is not None
    out = child.stdout.read()
    assert child.wait(timeout=60) == 0
    os.close(leader)
    return out, shown.decode()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a pseudo-terminal of a given size")
@pytest.mark.parametrize("columns", [100, 0])
def test_on_a_terminal_the_bar_is_drawn(backend: kv_api.Backend, columns: int) -> None:
    out, shown = _on_a_terminal(["replay", "--backend", backend.name, *FAST], columns)
    assert "hit rate" in out.decode()  # the table, on stdout
    last = shown.replace("\r\n", "\n").split("\r")[-1]
    assert last.startswith(f"replay ({backend.name}, 4M): 100%|") and "20/20 [" in last and "requests/s]" in last
    assert len(last.rstrip("\n")) <= (columns or 80)  # the terminal's width, or 80 where it has none
    quiet, shown = _on_a_terminal(["replay", "--backend", backend.name, *FAST, "--quiet"], columns)
    assert shown == "" and "hit rate" in quiet.decode()
