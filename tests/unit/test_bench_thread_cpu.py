"""The bench's per-thread CPU split (``bench.workloads.thread_cpu_s``): a busy thread's CPU is
counted under its role."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from loomfs.bench.workloads import cpu_by_role, thread_cpu_s

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc per-thread stats")


def test_a_busy_receive_thread_counts_as_recv() -> None:
    started = threading.Event()
    stop = threading.Event()

    def spin() -> None:
        started.set()
        x = 0
        while not stop.is_set():
            x += 1

    t = threading.Thread(target=spin, name="loomfs-recv-9", daemon=True)
    before = thread_cpu_s()
    t.start()
    assert started.wait(10)
    deadline = time.monotonic() + 30
    try:
        while cpu_by_role(before, thread_cpu_s()).get("recv", 0.0) < 0.05:  # CPU ticks are 10 ms
            assert time.monotonic() < deadline, "the spinning thread's CPU never showed under 'recv'"
            stop.wait(0.02)
    finally:
        stop.set()
        t.join(10)
    roles = {role for role, _ in thread_cpu_s().values()}
    assert "main" in roles
