"""The kvcache bench group: opt-in, and its rows (small values so it stays quick). No timing
assertions."""

from __future__ import annotations

import math

import pytest

import loomfs
from loomfs.bench import kvcache as kvb
from loomfs.bench.suite import Plan
from loomfs.bench.targets import LoomTarget
from loomfs.cli.bench import parse_groups

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_kvcache_group_is_opt_in() -> None:
    assert "kvcache" not in Plan().groups
    assert parse_groups("kvcache") == ["kvcache"]
    # --quick (big_bytes 32 MiB) leaves out batches over 32 MiB: 256 KiB and 2 MiB in batches of 256
    assert kvb.steps(32 << 20) == 3 * 2 + 2 + 2 and kvb.steps(1 << 30) == 3 * 2 + 3 + 3


def test_kvcache_bench_rows(fs: loomfs.LoomFS, base: str) -> None:
    lim = {"loopback_tcp_Bps": 1e9, "round_trips_per_s": 20_000.0, "disk_read_Bps": 5e8}
    steps: list[str] = []
    rows = kvb.run_kvcache(LoomTarget("", fs=fs), base, lim=lim, replicas=3, bytes_per_case=256 << 10,
                           batch_bytes_max=1 << 20, step=steps.append, sizes=(4096, 64 << 10), batches=(1, 8))
    names = {r.name for r in rows}
    for case in ("4k_b1", "4k_b8", "4k_b1_inline", "4k_b8_inline", "64k_b1", "64k_b8"):
        for op in ("put", "get") + (("getw",) if "inline" not in case else ()):
            assert {f"kv_{op}_{case}", f"kv_{op}_{case}_p50", f"kv_{op}_{case}_p99"} <= names, (op, case)
    assert len(steps) == 6
    for r in rows:
        assert r.value > 0 and math.isfinite(r.value) and r.limit_value > 0, r
    get = next(r for r in rows if r.name == "kv_get_64k_b8")
    assert get.limit_value == pytest.approx(1e9 / (64 << 10)) and get.extra["p50_us"] <= get.extra["p99_us"]
    # gets also carry min(raw TCP, disk read): values read once or twice come from the disk
    assert get.extra["cold_read_bound_values_per_s"] == pytest.approx(5e8 / (64 << 10))
    assert get.extra["ratio_to_cold_read_bound"] == pytest.approx(get.value * (64 << 10) / 5e8)
    assert not any(n.startswith("kv_") for n in fs.listdir(base))  # each case cleaned up
