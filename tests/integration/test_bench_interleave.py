"""``run_bench`` interleaves rounds (A, B, A, B) and measures the limits in each (issue 15
item 16). Two real local directories and the real limit measurements (loopback sockets,
spawned processes): no cluster needed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from loomfs.bench.suite import Plan, run_bench
from loomfs.bench.targets import LocalTarget

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


class _Logged(LocalTarget):
    def __init__(self, root: str, name: str, log: list[tuple[str, str]]):
        super().__init__(root)
        self.name, self.log = name, log

    def makedirs(self, path: str) -> None:
        if re.fullmatch(r"/\.bench/r\d+", path):
            self.log.append((self.name, path))
        super().makedirs(path)


def test_rounds_interleave_and_limits_are_remeasured(tmp_path: Path) -> None:
    log: list[tuple[str, str]] = []
    a = _Logged(str(tmp_path / "a"), "loomfs", log)
    b = _Logged(str(tmp_path / "b"), "compare:b", log)
    plan = Plan.quick()
    plan.groups, plan.rounds = ["small"], 2
    plan.small = [(30, 4096)]
    plan.tcp_bytes, plan.disk_bytes, plan.rtt_count = 16 << 20, 8 << 20, 500
    doc = run_bench([a, b], plan, 1, str(tmp_path), show_progress=False)
    assert log == [("loomfs", "/.bench/r0"), ("compare:b", "/.bench/r0"),
                   ("loomfs", "/.bench/r1"), ("compare:b", "/.bench/r1")]
    assert len(doc["limits_rounds"]) == 2 and doc["interleaved"] is True
    assert doc["limits_rounds"][0] != doc["limits_rounds"][1]  # measured twice, not copied
    rows = {(r["target"], r["name"]): r for r in doc["results"]}
    create = rows[("loomfs", "small_4k_create")]
    assert len(create["values"]) == 2 and create["min"] <= create["value"] <= create["max"]
    assert len(create["paired"]["ratios"]) == 2 and create["paired"]["target"] == "compare:b"
    assert doc["durability"]["compare:b"].startswith("fsync before close")
    assert doc["cold_caches"]["loomfs"]["kept"]
