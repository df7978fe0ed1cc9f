"""``kvcore replay --metrics-port``: a real process serving Prometheus metrics while it replays,
scraped over HTTP; bad ports are the flag's errors."""

from __future__ import annotations

import itertools
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

pytest.importorskip("kv_metrics")

from prometheus_client.parser import text_string_to_metric_families

KVCORE = [sys.executable, "-m", "kv_replay.cli"]


def scrape(url: str) -> dict[str, float] | None:
    """Each sample of engine 0 by name, or None where nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
    except (urllib.error.URLError, ConnectionError):
        return None
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("engine") == "0" and "level" not in sample.labels:
                assert sample.labels["model_name"] == "embedded"
                out[sample.name] = sample.value
    return out


def test_metrics_are_served_while_the_replay_runs() -> None:
    command = [*KVCORE, "replay", "--backend", "py", "--metrics-port", "0", "--quiet", "--json"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    first = process.stderr.readline()
    assert first.startswith("metrics: http://127.0.0.1:"), first
    url = first.split()[1]
    scrapes = []
    while process.poll() is None:
        samples = scrape(url)
        if samples and "vllm:prefix_cache_queries_total" in samples:
            scrapes.append(samples)
        time.sleep(0.02)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    report = json.loads(out)
    assert scrapes, "no scrape answered while the replay ran"
    for earlier, later in itertools.pairwise(scrapes):  # counters only go up
        for name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "kvcore_requests_total"):
            assert earlier[name] <= later[name]
    last = scrapes[-1]
    assert 0 < last["kvcore_requests_total"]
    assert last["vllm:prefix_cache_hits_total"] <= last["vllm:prefix_cache_queries_total"]
    assert 0 <= last["vllm:kv_cache_usage_perc"] <= 1
    assert report["requests"] > 0
    assert scrape(url) is None  # the endpoint goes with the command


def test_a_port_in_use_is_the_flags_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [*KVCORE, "replay", "--limit", "2", "--metrics-port", str(port)], capture_output=True, text=True
        )
    assert done.returncode == 2
    assert f"--metrics-port {port}: " in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("value", ["70000", "-1", "x"])
def test_a_bad_port_is_a_usage_error(value: str) -> None:
    done = subprocess.run([*KVCORE, "replay", "--metrics-port", value], capture_output=True, text=True)
    assert done.returncode == 2
    assert "--metrics-port" in done.stderr and "Traceback" not in done.stderr
