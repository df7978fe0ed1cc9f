"""``kvcore replay --publish``: a real replay's KV events, live on a loopback port, read by a real
``kvcore events --subscribe``; the flag's errors name it."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
from types import SimpleNamespace
from typing import IO, Any, cast

import pytest

import kv_api
from kv_api.capabilities import Capabilities
from kv_replay.cli import main
from kv_replay.publish import PublishError, check_backend

pytest.importorskip("kv_events")

FLAGS = ["--quiet", "--limit", "30", "--layers", "2", "--tokens-per-block", "16", "--quota", "4M"]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


def _kvcore(*argv: str) -> subprocess.Popen[str]:
    def default_sigint() -> None:  # a child of a shell without job control starts ignoring it
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    return subprocess.Popen(
        [sys.executable, "-m", "kv_replay.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        preexec_fn=default_sigint,
    )


class Lines:
    """A child's output stream, line by line as it comes, each within a deadline (a thread reads,
    so a line that never comes fails the test instead of hanging it)."""

    def __init__(self, stream: IO[str] | None) -> None:
        assert stream is not None
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self._lines.put(line)

    def next(self, timeout: float = 60) -> str:
        try:
            return self._lines.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"no line within {timeout} s")


@pytest.mark.requires("wire_events")
def test_a_replay_publishes_its_events_to_a_subscriber(backend: kv_api.Backend) -> None:
    # Port *: a free one, which the replay names. --wait-subscribers holds the replay until the
    # subscriber listens (ZeroMQ drops what is sent before), so every published event arrives.
    argv = ["--backend", backend.name, *FLAGS, "--json", "--publish", "tcp://127.0.0.1:*", "--wait-subscribers", "1"]
    replay = _kvcore("replay", *argv)
    subscriber: subprocess.Popen[str] | None = None
    replay_err = Lines(replay.stderr)
    try:
        said = replay_err.next()
        watch = r"\(watch: kvcore events --subscribe \1\)"
        found = re.fullmatch(rf"kvcore: publishing KV events on (tcp://127\.0\.0\.1:\d+) {watch}\n", said)
        assert found, said
        endpoint = found.group(1)
        assert replay_err.next() == f"kvcore: waiting for 1 subscriber on {endpoint}\n"
        subscriber = _kvcore("events", "--subscribe", endpoint, "--json")
        heard = Lines(subscriber.stdout)
        assert Lines(subscriber.stderr).next() == f"kvcore: waiting for events from {endpoint}; Ctrl-C to stop\n"
        assert replay.stdout is not None
        summary = json.loads(replay.stdout.read())
        assert replay.wait(timeout=120) == 0
        rest = replay_err.next()
        published = re.fullmatch(
            rf"kvcore: published ([\d,]+) events in ([\d,]+) batch(?:es)? on {re.escape(endpoint)}\n", rest
        )
        assert published, rest
        events = [json.loads(heard.next()) for _ in range(int(published.group(1).replace(",", "")))]
    finally:
        for child in (replay, subscriber):
            if child is not None and child.poll() is None:
                child.send_signal(signal.SIGINT)  # Ctrl-C: how an operator stops watching
                assert child.wait(timeout=30) == 130
    check_the_stream(events, summary)


def check_the_stream(events: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    """The stream a router would rebuild the replay's cache from: it starts empty, every removal
    is of a block stored before, full blocks of the replay's block size, and the manager's
    shutdown empties the tree at the end."""
    assert events[0]["type"] == "AllBlocksCleared" and events[0]["seq"] == 0
    assert [e["seq"] for e in events] == sorted(e["seq"] for e in events)
    live: set[int] = set()
    stored = 0
    for event in events[1:]:
        if event["type"] == "BlockStored":
            assert len(event["token_ids"]) == len(event["block_hashes"]) * summary["tokens_per_block"]
            live.update(event["block_hashes"])
            stored += len(event["block_hashes"])
        else:
            assert event["type"] == "BlockRemoved", event
            assert set(event["block_hashes"]) <= live
            live.difference_update(event["block_hashes"])
    assert stored > 0 and live == set()
    # Every prompt block reused was stored first: the stream has at least as many blocks.
    assert stored * summary["tokens_per_block"] >= summary["reused_tokens"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--publish", "nonsense"], "--publish: endpoint 'nonsense': no transport"),
        (["--publish", "tcp://127.0.0.1:99999"], "--publish: endpoint 'tcp://127.0.0.1:99999': port '99999' is not"),
        (["--publish", "udp://127.0.0.1:5557"], "--publish: endpoint 'udp://127.0.0.1:5557': unsupported transport"),
        (["--publish", "tcp://127.0.0.1:*", "--compare"], "--publish: not with --compare"),
        (["--publish", "tcp://127.0.0.1:*", "--quota", "4M,8M"], "--publish: not with a --quota list"),
        (["--publish", "tcp://127.0.0.1:*", "--instances", "2"], "--publish: not with --instances"),
        (["--wait-subscribers", "1"], "--wait-subscribers: needs --publish"),
        (["--progress", "--quiet"], "--quiet: not with --progress"),
    ],
)
def test_a_bad_publish_flag_is_one_line(capsys: pytest.CaptureFixture[str], flags: list[str], message: str) -> None:
    assert main(["replay", "--limit", "2", *flags]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"kvcore: error: {message}") and err.count("\n") == 1, err


@pytest.mark.requires("wire_events")
def test_a_busy_endpoint_names_the_flag(capsys: pytest.CaptureFixture[str], backend: kv_api.Backend) -> None:
    import zmq

    context = zmq.Context()
    taken = context.socket(zmq.PUB)
    try:
        port = taken.bind_to_random_port("tcp://127.0.0.1")
        code = main(["replay", "--backend", backend.name, *FLAGS, "--publish", f"tcp://127.0.0.1:{port}"])
    finally:
        taken.close(linger=0)
        context.term()
    out, err = capsys.readouterr()
    assert (code, out) == (2, "") and err.count("\n") == 1
    assert err.startswith(f"kvcore: error: --publish: endpoint 'tcp://127.0.0.1:{port}': Address already in use"), err


def test_a_backend_without_wire_events_is_refused_naming_the_flag() -> None:
    bare = cast(kv_api.Backend, SimpleNamespace(name="bare", capabilities=Capabilities()))
    with pytest.raises(PublishError, match=r"^--publish: backend 'bare' does not declare wire_events"):
        check_backend(bare)


def test_without_kv_events_publish_says_how_to_install_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "kv_events.endpoint", None)  # import kv_events.endpoint now fails
    assert main(["replay", "--publish", "tcp://127.0.0.1:*"]) == 2
    assert capsys.readouterr().err == (
        "kvcore: error: --publish: kv_events is not installed (pip install ./packages/kv-events)\n"
    )


@pytest.mark.requires("wire_events")
def test_the_replayer_flushes_each_steps_events(backend: kv_api.Backend) -> None:
    """As an engine's iteration does: a step's removals leave then, not at the end (a watcher's
    view would hold evicted blocks for the whole replay)."""
    from kv_api.events import Removed, Stored
    from kv_replay.model import model_config
    from kv_replay.replayer import Replayer
    from kv_replay.trace import Request, synthetic_tokens

    events = backend.KVCacheEventManager(1 << 16, "v2_sha256_64")
    config = model_config("1", 4, 2 << 20, (2 << 20) // (2 * 4 * 16))  # 16 blocks: evictions
    replayer = Replayer(backend, config, 1, event_manager=events)
    replayer.run([Request(synthetic_tokens(i, 40), synthetic_tokens(i, 2)) for i in range(6)])
    kinds = [type(e.data) for e in events.get_latest_events(0)]  # before any flush of the test's own
    assert Removed in kinds and Stored in kinds[kinds.index(Removed) :]  # removals between stores
    replayer.manager.shutdown()
