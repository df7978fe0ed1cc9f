"""Hashing large inputs does not hold the GIL in native backends, and stays correct across threads."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import kv_api


@pytest.mark.requires("native_buffers")
def test_hashing_releases_the_gil(backend: kv_api.Backend) -> None:
    tokens = np.arange(1 << 24, dtype=np.int32)
    start = time.perf_counter()
    backend.block_keys(32, None, tokens)
    alone = time.perf_counter() - start

    done = threading.Event()

    def work() -> None:
        backend.block_keys(32, None, tokens)
        done.set()

    worker = threading.Thread(target=work)
    last, longest = time.perf_counter(), 0.0
    worker.start()
    while not done.is_set():  # this loop only runs while the worker lets go of the GIL
        now = time.perf_counter()
        longest, last = max(longest, now - last), now
    worker.join()
    assert longest < alone / 2, f"main thread stalled {longest:.3f}s of a {alone:.3f}s hash"


def test_concurrent_hashing_is_correct(backend: kv_api.Backend) -> None:
    inputs = [np.arange(i * 1000, i * 1000 + 20_000, dtype=np.int32) for i in range(8)]
    expected = [kv_api.keys.block_keys(16, None, t.tolist()) for t in inputs]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda t: backend.block_keys(16, None, t), inputs))
    assert results == expected
