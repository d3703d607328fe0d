"""The bench's honest arithmetic (issue 15 items 16-19), without a cluster: per-round and
paired ratios, one direction, readdir's reachable limit, durable comparison writes, the
table's statements."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from loomfs.bench.report import table_lines
from loomfs.bench.rounds import pair, ratio_hb, summarize
from loomfs.bench.suite import Plan, readdir_limit, steps_total
from loomfs.bench.targets import LocalTarget, _FsyncOnClose
from loomfs.bench.workloads import Result


def _rounds(name: str, unit: str, values: list[float], limits: list[float]) -> list[list[Result]]:
    return [[Result(name, v, unit, "lim", lim)] for v, lim in zip(values, limits, strict=True)]


def test_ratio_is_the_median_of_per_round_ratios_not_a_ratio_of_medians() -> None:
    row = summarize("loomfs", _rounds("w", "ops/s", [10, 20, 30], [100, 10, 30]))[0]
    assert row["value"] == 20 and (row["min"], row["max"]) == (10, 30)
    assert row["ratios"] == [0.1, 2.0, 1.0] and row["ratio"] == 1.0  # not 20 / 30
    assert row["ratio_hb"] == 1.0 and row["us_per_op"] == pytest.approx(1e6 / 20)


def test_paired_ratio_per_round_then_median() -> None:
    main = summarize("loomfs", _rounds("w", "B/s", [10, 100, 50], [1, 1, 1]))
    other = summarize("compare:x", _rounds("w", "B/s", [30, 4, 200], [0, 0, 0]))
    pair(main, other, "compare:x")
    p = main[0]["paired"]
    assert p["ratios"] == pytest.approx([1 / 3, 25, 0.25])
    assert p["median"] == pytest.approx(1 / 3)  # the ratio of medians would say 50/30 = 1.67
    assert (p["min"], p["max"]) == (pytest.approx(0.25), 25)


def test_one_direction_higher_is_better() -> None:
    assert ratio_hb(2.0, 4.0, "s") == 2.0  # half the time: twice as good
    assert ratio_hb(2.0, 4.0, "ops/s") == 0.5
    row = summarize("loomfs", _rounds("t", "s", [2.0, 2.0], [4.0, 4.0]))[0]
    assert row["ratio"] == 0.5 and row["ratio_hb"] == 2.0 and not row["higher_is_better"]
    main = summarize("loomfs", _rounds("t", "s", [1.0], [1.0]))
    pair(main, summarize("c", _rounds("t", "s", [3.0], [0.0])), "c")
    assert main[0]["paired"]["median"] == 3.0  # LoomFS took a third of the time


def test_readdir_limit_is_pages_of_round_trips() -> None:
    from loomfs.client.core import READDIR_PAGE

    lim = {"round_trips_per_s": 10_000.0, "loopback_tcp_Bps": 1e9, "round_trips_2pairs_per_s": 15_000.0,
           "loopback_tcp_2streams_Bps": 1.5e9}
    name, v = readdir_limit(lim)
    per_page_s = 1 / 10_000 + READDIR_PAGE * 256 / 1e9
    assert v == pytest.approx(READDIR_PAGE / per_page_s)
    assert v < 1e9 / 256 and v < 10_000 * READDIR_PAGE  # below either bound alone
    assert f"{READDIR_PAGE}-entry pages" in name
    assert readdir_limit(lim, 4)[1] > v


def test_limits_are_measured_every_round() -> None:
    plan = Plan.quick()
    plan.groups = ["small"]
    plan.rounds = 1
    one = steps_total(plan, 2)
    plan.rounds = 3
    assert steps_total(plan, 2) == 3 * one


def test_comparison_writes_are_fsynced_before_close(tmp_path: Path) -> None:
    t = LocalTarget(str(tmp_path))
    f = t.open("/a", "wb")
    assert isinstance(f, io.BufferedWriter) and isinstance(f.raw, _FsyncOnClose)
    f.write(b"abc")
    f.close()
    assert t.read_file("/a") == b"abc"
    assert "fsync before close" in t.durability()
    assert "page cache only" in LocalTarget(str(tmp_path), durable=False).durability()
    with LocalTarget(str(tmp_path), durable=False).open("/b", "wb") as plain:
        assert not isinstance(plain.raw, _FsyncOnClose)
    caches = t.drop_caches("/a")
    assert caches["dropped"] and any("VM host" in k for k in caches["kept"])


def test_table_states_rounds_durability_caches_and_cache_hits() -> None:
    caches = {"dropped": ["page cache X"], "kept": ["the VM host's disk cache"]}
    loom = summarize("loomfs", [[Result("rand_read_4k", v, "IOPS", "raw round trips", 1000.0,
                                        {"p50_ms": 1, "p95_ms": 2, "p99_ms": 3, "caches": caches,
                                         "round_trips_per_s": 1000.0, "above_round_trip_limit": False})]
                                for v in (400.0, 500.0, 600.0)])
    cmp = summarize("compare:/d", [[Result("rand_read_4k", v, "IOPS", "", 0.0,
                                           {"p50_ms": 1, "p95_ms": 2, "p99_ms": 3, "caches": caches,
                                            "round_trips_per_s": 1000.0, "above_round_trip_limit": True})]
                                   for v in (5000.0, 4000.0, 2000.0)])
    pair(loom, cmp, "compare:/d")
    doc = {"limits": {"round_trips_per_s": 1000.0}, "rounds": 3, "targets": ["loomfs", "compare:/d"],
           "results": loom + cmp, "durability": {"loomfs": "replicated in memory", "compare:/d": "fsync before close"},
           "limits_rounds": [{"round_trips_per_s": 900.0}, {"round_trips_per_s": 1100.0}, {"round_trips_per_s": 1000.0}]}
    text = "\n".join(table_lines(doc))
    assert "3 round(s), interleaved" in text and "x compare" in text
    assert "durability of loomfs: replicated in memory" in text and "durability of compare:/d: fsync" in text
    assert "400-600 IOPS" in text and "2,000-5,000 IOPS" in text
    row = next(ln for ln in text.splitlines() if ln.startswith("rand_read_4k"))
    assert row.split()[-2:] == ["0.12", "0.08-0.30"]  # per round 400/5000, 500/4000, 600/2000: median 0.125
    assert "above the raw round-trip limit" in text and "not dropped: the VM host's disk cache" in text
    assert "raw round trips over the rounds: 900/s - 1,100/s" in text


def test_group_tables_print_binary_units() -> None:
    from loomfs.bench.report import checkpoint_lines

    row = {"name": "ckpt_save_1r", "target": "loomfs", "unit": "B/s", "value": float(1 << 20),
           "limit_name": "", "limit_value": 0.0, "ratio": None, "extra": {"MBps": 1.048576, "seconds": 1.0}}
    lines = checkpoint_lines({"targets": ["loomfs"], "results": [row]})
    assert "MiB/s" in lines[2] and " MB/s" not in "\n".join(lines)
    assert lines[3].split()[1] == "1.0"  # 1.048576 MB/s is 1.0 MiB/s


def test_loomfs_metadata_durability_is_stated(tmp_path: Path) -> None:
    from loomfs.bench.targets import meta_durability

    (tmp_path / "meta1").mkdir()
    cfg = tmp_path / "meta1" / "config.toml"
    cfg.write_text('store_url = "sqlite:///x/meta.db"\n')
    assert "synchronous=NORMAL" in meta_durability(str(tmp_path)) and "power" in meta_durability(str(tmp_path))
    cfg.write_text('store_url = "sqlite:///x/meta.db"\nsqlite_synchronous = "FULL"\n')
    assert "fsynced on commit" in meta_durability(str(tmp_path))
    assert "not visible" in meta_durability("10.0.0.1:8000")


def test_small_file_table_states_what_cold_dropped(tmp_path: Path) -> None:
    from loomfs.bench.report import smallfile_lines

    row = {"name": "sf_read_cold_1t", "target": "compare:/d", "unit": "files/s", "value": 100.0, "ratio": 0.5,
           "limit_name": "", "limit_value": 0.0, "extra": {}}
    doc = {"targets": ["compare:/d"], "results": [row],
           "cold_caches": {"compare:/d": LocalTarget(str(tmp_path)).cold_caches()}}
    text = "\n".join(smallfile_lines(doc))
    assert "cold stat/read/batches: dropped this host's page cache of each file" in text
    assert "not dropped: the kernel's dentry and inode caches" in text
