"""``kvcore replay --instances N --router ...``: routers agree where they should, the oracle beats
round-robin, the report's numbers add up, and bad flags are one-line errors naming the flag."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from replay_gates import skip_unless

import kv_api
from kv_replay.cli import main
from kv_replay.cluster import ClusterResult, cluster_report, replay_cluster
from kv_replay.model import model_config
from kv_replay.trace import Request

TPB = 16
# 2 layers of 2 x 256 bytes per token: 16 KiB per block, 128 blocks in 2 MiB per instance.
CONFIG = model_config("2", TPB, 2 << 20, 256, True, None)


def trace() -> list[Request]:
    """Six groups, each a 40-block shared prefix, then a question: an instance holds about three
    prefixes, so spreading each group over every instance (round-robin) thrashes, while sending a
    group where its prefix is (kv) keeps it."""
    rng = np.random.default_rng(5)
    prefixes = [rng.integers(0, 30_000, 40 * TPB, dtype=np.int32) for _ in range(6)]
    out = []
    for _ in range(60):
        question = rng.integers(30_000, 60_000, rng.integers(1, 3 * TPB), dtype=np.int32)
        prompt = np.concatenate([prefixes[int(rng.integers(0, 6))], question])
        out.append(Request(prompt, rng.integers(0, 60_000, 4, dtype=np.int32)))
    return out


def replay(router: str, backend: kv_api.Backend | None = None) -> ClusterResult:
    backend = backend or kv_api.load_backend()
    return replay_cluster(backend, CONFIG, trace(), instances=3, router=router, max_in_flight=4)


def test_kv_oracle_beats_round_robin_and_the_report_adds_up() -> None:
    kv, rr = replay("kv"), replay("round-robin")
    reports = [cluster_report(kv), cluster_report(rr)]
    assert reports[0]["hit_rate"] > reports[1]["hit_rate"] + 0.1, reports
    for rep, result in zip(reports, (kv, rr), strict=True):
        assert rep["requests"] == 60 == sum(i["requests"] for i in rep["per_instance"])
        assert rep["reused_tokens"] == sum(i["reused_tokens"] for i in rep["per_instance"])
        assert len(result.routing_seconds) == 60
    assert rr.routed == [i % 3 for i in range(60)]


@pytest.mark.requires("wire_events")
def test_dynamo_routes_as_the_oracle_once_events_settle(backend: kv_api.Backend) -> None:
    from kv_events.indexer import dynamo_missing

    if dynamo_missing() is not None:
        pytest.skip(f"{dynamo_missing()}: the real router")
    kv, dynamo = replay("kv", backend), replay("dynamo", backend)
    # Prompts share whole-block prefixes only, so partial blocks (which the oracle counts and the
    # indexer does not) never decide: every pick must match.
    assert dynamo.routed == kv.routed
    assert cluster_report(dynamo)["hit_rate"] == cluster_report(kv)["hit_rate"] > 0.5


def test_cli_prints_every_router_and_plots(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    argv = ["replay", "mooncake-synthetic", "--limit", "20", "--quiet", "--layers", "2", "--quota", "8M"]
    argv += ["--tokens-per-block", str(TPB), "--instances", "2", "--router", "round-robin,kv", "--json"]
    assert main([*argv, "--plot", str(tmp_path / "r.png")]) == 0
    reports = json.loads(capsys.readouterr().out)
    assert [r["router"] for r in reports] == ["round-robin", "kv"]
    assert all(len(r["per_instance"]) == 2 for r in reports)
    assert (tmp_path / "r.png").stat().st_size > 0


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--instances", "0"], "--instances: must be in [1, 64] (got 0)"),
        (["--router", "bogus"], "--router: unknown router 'bogus' (choose from round-robin, kv, dynamo)"),
        (["--instances", "2", "--compare"], "--compare: not with --instances/--router"),
        (["--instances", "2", "--quota", "8M,16M"], "--quota: not with --instances/--router"),
    ],
)
def test_bad_flags_are_one_line_errors(capsys: pytest.CaptureFixture[str], flags: list[str], message: str) -> None:
    assert main(["replay", "--quiet", *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize(
    ("flags", "message", "needs"),
    [
        (["--quota", "1P"], "--quota 1P: cannot map ", ()),
        (["--host-quota", "1P"], "--host-quota 1P: cannot map ", ("host_tier",)),
        (["--disk-quota", "1P"], "--disk-quota 1P: disk tier: ", ("disk_tier",)),
    ],
)
def test_a_quota_the_instances_cannot_have_names_the_flag(
    capsys: pytest.CaptureFixture[str], backend: kv_api.Backend, flags: list[str], message: str, needs: tuple[str]
) -> None:
    # The regression: a cluster built its managers outside the translation a single replay has,
    # so these were tracebacks (or an errno and the temporary directory's name).
    skip_unless(backend, *needs)
    code = main(["replay", "--quiet", "--limit", "4", "--backend", backend.name, "--instances", "2", *flags])
    out, err = capsys.readouterr()
    if code == 0 and flags[0] == "--disk-quota":
        pytest.skip("this file system takes a sparse file of 1 PiB")
    assert (code, out) == (2, "") and err.startswith(f"kvcore: error: {message}") and err.count("\n") == 1, err
    assert "kvcore-replay-" not in err


def test_dynamo_missing_is_a_one_line_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import kv_events.indexer

    monkeypatch.setattr(kv_events.indexer, "dynamo_missing", lambda: "dynamo.indexer is not installed (pip ...)")
    assert main(["replay", "--quiet", "--limit", "2", "--instances", "2", "--router", "dynamo"]) == 2
    err = capsys.readouterr().err
    assert err == "kvcore: error: --router dynamo: dynamo.indexer is not installed (pip ...)\n"


@pytest.mark.requires("wire_events")
def test_events_prints_one_line_per_event(capsys: pytest.CaptureFixture[str], backend: kv_api.Backend) -> None:
    import threading

    from kv_api import ReuseScope, create_manager
    from kv_events import EventPublisher

    events = backend.KVCacheEventManager(1000, "v2_sha256_64")
    manager = create_manager(CONFIG, backend=backend, event_manager=events)
    with EventPublisher(events, CONFIG, "tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*") as pub:
        pub.flush()  # the manager's AllBlocksCleared goes out before anyone listens

        def drive() -> None:
            assert pub.wait_for_subscribers(1)
            tokens = list(range(2 * TPB))
            cache = manager.create_kv_cache(ReuseScope(), tokens)
            assert cache.resume() and cache.resize(len(tokens))
            cache.commit(tokens)
            cache.close()
            pub.flush()

        thread = threading.Thread(target=drive)
        thread.start()
        argv = ["events", "--subscribe", pub.endpoint, "--replay", str(pub.replay_endpoint), "--count", "1", "--json"]
        assert main(argv) == 0
        thread.join()
    out, err = capsys.readouterr()
    line = json.loads(out)
    assert line["type"] == "BlockStored" and line["token_ids"] == list(range(2 * TPB)) and line["seq"] >= 0
    # Said before anything came: what it waits for, and where.
    where = f"{pub.endpoint} (replay socket {pub.replay_endpoint})"
    assert err == f"kvcore: waiting for events from {where}; Ctrl-C to stop\n"


@pytest.mark.parametrize("endpoint", ["nonsense", "tcp://127.0.0.1:notaport"])
def test_events_bad_endpoint_is_one_line(capsys: pytest.CaptureFixture[str], endpoint: str) -> None:
    assert main(["events", "--subscribe", endpoint]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kvcore: error: --subscribe: endpoint {endpoint!r}") and err.count("\n") == 1
