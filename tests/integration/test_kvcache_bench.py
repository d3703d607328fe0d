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
                           batch_bytes_max=1 << 20, step=steps.append, sizes=(4096, 64 << 10), batches=(1, 16))
    names = {r.name for r in rows}
    for case in ("4k_b1", "4k_b16", "4k_b1_inline", "4k_b16_inline", "64k_b1", "64k_b16"):
        ops = ("put", "get") + (("getw",) if "inline" not in case else ()) + (
            ("geth",) if "b16" in case and "inline" not in case else ())
        for op in ops:
            assert {f"kv_{op}_{case}", f"kv_{op}_{case}_p50", f"kv_{op}_{case}_p99"} <= names, (op, case)
    assert not {"kv_geth_4k_b1", "kv_geth_4k_b16_inline"} & names  # hot passes: batches of 16+, not inline
    assert len(steps) == 6
    for r in rows:
        assert r.value > 0 and math.isfinite(r.value) and r.limit_value > 0, r
    by = {r.name: r for r in rows}
    get = by["kv_get_64k_b16"]
    # cold gets (values read the first or second time: from the disk): min(raw TCP, disk read)
    assert get.extra["case"] == "cold" and get.limit_value == pytest.approx(5e8 / (64 << 10))
    assert get.limit_name.startswith("min(raw TCP, disk read)") and get.extra["p50_us"] <= get.extra["p99_us"]
    assert get.extra["ratio_to_raw_tcp"] == pytest.approx(get.value * (64 << 10) / 1e9)
    assert by["kv_getw_64k_b16"].extra["case"] == "cold"
    hot = by["kv_geth_64k_b16"]  # read the fourth time: from the storage page cache, against raw TCP
    assert hot.extra["case"] == "hot" and hot.limit_value == pytest.approx(1e9 / (64 << 10))
    # the hot pass repeats until it moved 8x the case's bytes (64 x 4 KiB a pass: 8 passes of 4 batches)
    assert by["kv_geth_4k_b16"].extra["batches_timed"] == 32 and by["kv_get_4k_b16"].extra["batches_timed"] == 4
    inline = by["kv_get_4k_b16_inline"]  # in meta: no disk
    assert inline.limit_value == pytest.approx(1e9 / 4096)
    assert not any(n.startswith("kv_") for n in fs.listdir(base))  # each case cleaned up


def _row(name: str, value: float, limit: float, size: int, batch: int, case: str) -> dict[str, object]:
    return {"target": "loomfs", "name": name, "value": value, "unit": "values/s", "limit_name": "x",
            "limit_value": limit, "extra": {"size_bytes": size, "batch": batch, "case": case,
                                            "bytes_per_s": value * size, "ratio_to_raw_tcp": 0.5}}


def test_kvcache_target_check_and_lines() -> None:
    rows = [_row("kv_geth_2m_b16", 700, 1000, 2 << 20, 16, "hot"),
            _row("kv_get_2m_b256", 500, 1000, 2 << 20, 256, "cold"),
            _row("kv_getw_16k_b256", 25_000, 100_000, 16 << 10, 256, "cold"),
            _row("kv_get_16k_b16", 5_000, 100_000, 16 << 10, 16, "cold"),
            _row("kv_get_2m_b1", 50, 1000, 2 << 20, 1, "cold")]
    checks = [kvb.target_check(r) for r in rows]
    assert checks[0] == (">= 0.6 of raw TCP", True)
    assert checks[1] == (">= 0.6 of min(TCP, disk)", False)
    assert checks[2] == (">= 20k values/s", True)
    assert checks[3] is None and checks[4] is None  # no target for these batches
    lines = kvb.target_lines({"targets": ["loomfs"], "results": rows})
    assert "issue 14" in lines[1] and len(lines) == 3 + len(rows)
    assert lines[3].split()[:2] == ["kv_geth_2m_b16", "hot"] and lines[3].endswith("yes")
    assert lines[4].endswith("no") and lines[6].rstrip().endswith("0.50")
