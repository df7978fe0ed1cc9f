"""Dynamo's standalone KV indexer (``python -m dynamo.indexer``, PyPI ``ai-dynamo-runtime``) as a
subprocess: the real consumer of the wire, for tests and ``kvcore replay --router dynamo``.

It subscribes to each worker's endpoint and answers ``POST /query {"token_ids", "model_name"}``
with ``{"scores": {worker: {dp_rank: device tokens}}, "instances": {worker: {"longest_matched",
"gpu", "cpu", "disk", "dp"}}}``: matched tokens of the longest prefix per worker, whole blocks only,
where ``cpu`` and ``disk`` count a prefix found on that tier or a warmer one. Workers with no match
are absent.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType

__all__ = ["DynamoIndexer", "IndexerError", "Overlap", "dynamo_missing", "free_port"]

MODULE = "dynamo.indexer"


class IndexerError(RuntimeError):
    """The indexer could not be started or did not answer."""


@dataclass(frozen=True)
class Overlap:
    """One worker's match for a query, in tokens."""

    device: int  # the longest prefix on the device (GPU) tier
    any_tier: int  # the longest prefix on any tier


def dynamo_missing() -> str | None:
    """Why the indexer cannot run here (a line naming the package), or None."""
    try:
        found = importlib.util.find_spec(MODULE) is not None
    except ImportError:  # the ``dynamo`` namespace itself is absent
        found = False
    if not found:
        return f"{MODULE} is not installed (pip install 'ai-dynamo-runtime>=1.6')"
    return None


def free_port() -> int:
    """A loopback port free now (the indexer's HTTP port must be given to it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class DynamoIndexer:
    def __init__(
        self, workers: Mapping[int, str], block_size: int, *, startup_timeout: float = 30.0, threads: int = 1
    ) -> None:
        """Start the indexer on a free port, subscribed to ``workers`` (id → ZeroMQ endpoint), and
        wait until it answers."""
        missing = dynamo_missing()
        if missing is not None:
            raise IndexerError(missing)
        self.block_size = block_size
        self.port = free_port()
        self._log = tempfile.TemporaryFile()
        spec = ",".join(f"{worker}={endpoint}" for worker, endpoint in workers.items())
        command = [sys.executable, "-m", MODULE, "--block-size", str(block_size), "--port", str(self.port)]
        command += ["--threads", str(threads), "--workers", spec]
        env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")}
        self._process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + startup_timeout
        while True:
            if self._process.poll() is not None:
                raise IndexerError(f"{MODULE} exited with status {self._process.returncode}: {self.log_tail()}")
            try:
                self.query([0] * block_size, timeout=1.0)
                break
            except (OSError, urllib.error.URLError):
                if time.monotonic() > deadline:
                    self.close()
                    raise IndexerError(
                        f"{MODULE} did not answer on port {self.port} within {startup_timeout}s"
                    ) from None
                time.sleep(0.05)

    def query_raw(self, token_ids: list[int], timeout: float = 5.0) -> dict[str, object]:
        body = json.dumps({"token_ids": [int(t) for t in token_ids], "model_name": "default"}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/query", body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            answer: dict[str, object] = json.loads(response.read())
            return answer

    def query(self, token_ids: list[int], timeout: float = 5.0) -> dict[int, Overlap]:
        """Each matching worker's overlap with ``token_ids``."""
        answer = self.query_raw(token_ids, timeout)
        instances = answer.get("instances") or {}
        assert isinstance(instances, dict)
        return {
            int(worker): Overlap(int(match.get("gpu", 0)), int(match.get("longest_matched", 0)))
            for worker, match in instances.items()
        }

    def log_tail(self, chars: int = 2000) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-chars:]

    def close(self) -> None:
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._log.close()

    def __enter__(self) -> DynamoIndexer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
