"""``loomfs bench --quick`` as a smoke run: the JSON has every workload, every figure is
positive and carries its limit, the PNG is drawn. No timing assertions."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

EXPECTED = {
    "seq_write", "seq_read", "seq_write_durable", "rand_read_4k", "rand_read_64k", "seq_write_2p", "seq_read_2p",
    *(f"md_{ph}_{p}p_{mode}" for ph in ("create", "stat", "readdir", "unlink") for p in (1, 4)
      for mode in ("shared", "perproc")),
    *(f"small_{s}_{ph}" for s in ("4k", "128k") for ph in ("create", "stat", "read")),
    "lookup_100", "lookup_1000", "lookup_3000",
    *(f"dir_{ph}_{n}" for ph in ("create", "list") for n in (100, 1000, 3000)),
}
SMALLFILES = {
    *(f"sf_{ph}_{k}t" for ph in ("create", "stat", "read_cold", "unlink") for k in (1, 4)),
    "sf_read_many", "sf_stat_many",
}
EXPECTED |= SMALLFILES
# The DataLoader group (needs torch): --quick runs 300 x 4 KiB and 100 x 112 KiB with 0 and 2
# workers; a LoomFS target also has the local copy's rows (dl_local_*), a --compare one not.
DATALOADER = {f"dl_{k}_{s}_{w}w" for k in ("files", "shards") for s in ("4k", "112k") for w in (0, 2)}
DATALOADER_LOCAL = {n.replace("dl_", "dl_local_", 1) for n in DATALOADER}
# The checkpoint group (needs torch): a LoomFS target only (its local DCP figures beside it).
CHECKPOINT = {
    *(f"ckpt_{op}_{r}r" for op in ("save", "load") for r in (1, 2)),
    "ckpt_local_save", "ckpt_local_load", "ckpt_local_save_2r", "ckpt_local_load_2r",
    # what each side of a save wrote to the disk, against the disk's fsync'd-write limit
    "ckpt_disk_save_1r", "ckpt_disk_local_save", "ckpt_disk_save_2r", "ckpt_disk_local_save_2r",
    "ckpt_block_sync_s", "ckpt_block_async_s", "ckpt_staging_copy_s",
}
LIMIT_KEYS = {"loopback_tcp_Bps", "loopback_tcp_2streams_Bps", "round_trips_per_s", "round_trips_2pairs_per_s",
              "round_trips_pinned_per_s", "disk_write_Bps", "disk_read_Bps", "disk_fsync_write_Bps",
              "disk_fsync_read_Bps", "memcpy_Bps"}


def test_bench_quick_json_plot_and_compare(cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out, png, cmp_dir = tmp_path / "bench.json", tmp_path / "bench.png", tmp_path / "compare"
    chunks = tmp_path / "chunkserver"  # stands in for a DFS chunk server's data on this host
    chunks.mkdir()
    (chunks / "chunk_0001.mfs").write_bytes(os.urandom(1 << 16))
    proc = subprocess.run(
        [sys.executable, "-m", "loomfs.cli.main", "--dir", str(cluster.root), "bench", "--quick",
         "--json", str(out), "--plot", str(png), "--compare", str(cmp_dir), "--compare-drop", str(chunks),
         "--no-progress"],
        capture_output=True, text=True, timeout=200,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["schema"] == 2 and doc["quick"] is True and doc["replicas"] == cluster.replicas
    assert set(doc["limits"]) == LIMIT_KEYS and all(v > 0 for v in doc["limits"].values())
    assert doc["targets"] == ["loomfs", f"compare:{cmp_dir}"]
    for tgt in doc["targets"]:
        rows = {r["name"]: r for r in doc["results"] if r["target"] == tgt}
        want = EXPECTED | DATALOADER | (DATALOADER_LOCAL | CHECKPOINT if tgt == "loomfs" else set())
        assert set(rows) == want, set(rows) ^ want
        for r in rows.values():
            assert r["value"] > 0 and math.isfinite(r["value"]), r
    for r in (r for r in doc["results"] if r["target"] == "loomfs"):
        assert r["limit_value"] > 0 and r["ratio"] == pytest.approx(r["value"] / r["limit_value"]), r
    rr = next(r for r in doc["results"] if r["name"] == "rand_read_4k" and r["target"] == "loomfs")
    e = rr["extra"]
    assert 0 < e["p50_ms"] <= e["p95_ms"] <= e["p99_ms"] and len(e["cdf_ms"]) > 10
    assert e["cdf_ms"] == sorted(e["cdf_ms"])
    seq = next(r for r in doc["results"] if r["name"] == "seq_write" and r["target"] == "loomfs")
    assert seq["extra"]["disk_bound_Bps"] > 0  # the "vs disk" column
    # issue 15 item 21: a durable layout dir, on 2-replica chains where the cluster has them
    # (this one has only its 3-replica table: the row says so)
    dur = {r["target"]: r for r in doc["results"] if r["name"] == "seq_write_durable"}
    assert dur["loomfs"]["extra"]["replicas"] == cluster.replicas and "O_DIRECT" in dur["loomfs"]["limit_name"]
    assert dur[f"compare:{cmp_dir}"]["extra"]["replicas"] == 0
    assert "vs disk" in proc.stdout and "x compare" in proc.stdout and "seq_read_2p" in proc.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    assert not list(cmp_dir.joinpath(".bench").iterdir())  # the compare run cleaned up after itself
    # --compare-drop: the compare side's cold reads also drop that directory's files, and say so
    cmp_cold = next(r for r in doc["results"] if r["name"] == "seq_read" and r["target"] != "loomfs")
    assert any(f"all 1 files under {chunks}" in d for d in cmp_cold["extra"]["caches"]["dropped"]), cmp_cold
    assert any(str(chunks) in d for d in doc["cold_caches"][f"compare:{cmp_dir}"]["dropped"])


def test_bench_only_smallfiles(cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """``--only smallfiles``: only the round-trip limits, only the sf_ rows, each held against
    the pinned limit (both targets), and the table of issue 16 targets printed."""
    out, cmp_dir = tmp_path / "sf.json", tmp_path / "compare"
    proc = subprocess.run(
        [sys.executable, "-m", "loomfs.cli.main", "--dir", str(cluster.root), "bench", "--quick",
         "--only", "smallfiles", "--files-small", "150", "--json", str(out), "--compare", str(cmp_dir),
         "--no-progress"],
        capture_output=True, text=True, timeout=200,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert set(doc["limits"]) == {"round_trips_per_s", "round_trips_pinned_per_s"}
    assert doc["plan"]["groups"] == ["smallfiles"] and doc["plan"]["sf_files"] == 150
    pinned = doc["limits"]["round_trips_pinned_per_s"]
    for tgt in doc["targets"]:
        rows = {r["name"]: r for r in doc["results"] if r["target"] == tgt}
        assert set(rows) == SMALLFILES, set(rows) ^ SMALLFILES
        for r in rows.values():
            assert r["value"] > 0 and math.isfinite(r["value"]) and r["unit"] == "files/s", r
            assert r["limit_value"] == pinned and r["ratio"] == pytest.approx(r["value"] / pinned), r
            assert r["extra"]["files"] == 150, r
    assert "issue 16 targets" in proc.stdout and ">= 0.08 of limit" in proc.stdout
    assert "x 1t (now" in proc.stdout
    assert not list(cmp_dir.joinpath(".bench").iterdir())


def test_bench_only_dataloader(cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """``--only dataloader``: LoomFS and local rows in samples/s; file rows held against the
    local plain Dataset of the same run, shard rows against min(disk read, TCP) per sample;
    the consumer rate printed; nothing left behind."""
    out = tmp_path / "dl.json"
    proc = subprocess.run(
        [sys.executable, "-m", "loomfs.cli.main", "--dir", str(cluster.root), "bench", "--quick",
         "--only", "dataloader", "--consumer-rate", "500", "--json", str(out), "--no-progress"],
        capture_output=True, text=True, timeout=200,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert set(doc["limits"]) == LIMIT_KEYS and doc["plan"]["groups"] == ["dataloader"]
    lim = doc["limits"]
    rows = {r["name"]: r for r in doc["results"]}
    assert set(rows) == DATALOADER | DATALOADER_LOCAL, set(rows) ^ (DATALOADER | DATALOADER_LOCAL)
    for r in rows.values():
        e = r["extra"]
        assert r["unit"] == "samples/s" and r["value"] > 0 and math.isfinite(r["value"]), r
        assert r["limit_value"] > 0 and r["ratio"] == pytest.approx(r["value"] / r["limit_value"]), r
        assert e["files"] == (300 if e["size_bytes"] == 4096 else 100) and e["workers"] in (0, 2), r
        assert e["MBps"] == pytest.approx(r["value"] * e["size_bytes"] / 1e6), r
        assert e["consumer_rate"] == 500 and e["gpus_fed"] == pytest.approx(r["value"] / 500), r
    for name in DATALOADER:
        r = rows[name]
        if "_files_" in name:
            assert r["limit_value"] == rows[name.replace("dl_", "dl_local_", 1)]["value"], r
            assert r["extra"]["target_ratio"] == 0.5
        else:
            e = r["extra"]
            assert e["cold_read_Bps"] == min(e["disk_read_Bps"], e["tcp_Bps"]) == min(
                lim["disk_read_Bps"], lim["loopback_tcp_Bps" if e["workers"] < 2 else "loopback_tcp_2streams_Bps"])
            assert r["limit_value"] == pytest.approx(e["cold_read_Bps"] / e["shard_bytes_per_sample"]), r
            assert e["size_bytes"] < e["shard_bytes_per_sample"] and e["target_ratio"] == 0.8
    assert "issue 9 targets" in proc.stdout and ">= 0.8 of limit" in proc.stdout
    assert "x consumer" in proc.stdout and "consumer rate (500 samples/s" in proc.stdout
    assert not list(Path(cluster.root).glob("bench-dl-*"))  # the local copy is gone


def test_bench_only_checkpoint(cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """``--only checkpoint --ckpt-size 8M``: DCP save/load MB/s with 1 and 2 ranks held against
    DCP's local FileSystemWriter/Reader of the same run; the blocked time of sync and async
    saves held against the staging copy; a --compare target gets no rows; nothing left behind."""
    out, cmp_dir = tmp_path / "ckpt.json", tmp_path / "compare"
    proc = subprocess.run(
        [sys.executable, "-m", "loomfs.cli.main", "--dir", str(cluster.root), "bench", "--quick",
         "--only", "checkpoint", "--ckpt-size", "8M", "--json", str(out), "--compare", str(cmp_dir),
         "--no-progress"],
        capture_output=True, text=True, timeout=200,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert set(doc["limits"]) == LIMIT_KEYS and doc["plan"]["groups"] == ["checkpoint"]
    assert doc["plan"]["ckpt_bytes"] == 8 << 20
    rows = {r["name"]: r for r in doc["results"] if r["target"] == "loomfs"}
    assert set(rows) == CHECKPOINT, set(rows) ^ CHECKPOINT
    assert not [r for r in doc["results"] if r["target"] != "loomfs"]
    for r in rows.values():
        assert r["value"] > 0 and math.isfinite(r["value"]), r
        assert r["limit_value"] > 0 and r["ratio"] == pytest.approx(r["value"] / r["limit_value"]), r
    for op in ("save", "load"):
        assert rows[f"ckpt_{op}_1r"]["limit_value"] == rows[f"ckpt_local_{op}"]["value"]
        assert rows[f"ckpt_{op}_2r"]["limit_value"] == rows[f"ckpt_local_{op}_2r"]["value"]
        assert rows[f"ckpt_{op}_1r"]["extra"]["bytes"] == 8 << 20
        assert rows[f"ckpt_{op}_2r"]["extra"]["ranks"] == 2
    stage = rows["ckpt_staging_copy_s"]["value"]
    assert rows["ckpt_block_async_s"]["limit_value"] == rows["ckpt_block_sync_s"]["limit_value"] == stage
    assert rows["ckpt_block_async_s"]["extra"]["async_total_s"] >= rows["ckpt_block_async_s"]["value"]
    assert "issue 10 targets" in proc.stdout and ">= 0.8 of local" in proc.stdout
    assert "<= staging copy" in proc.stdout
    assert not list(Path(cluster.root).glob("bench-ckpt-*"))  # the local copies are gone
    assert not list(cmp_dir.joinpath(".bench").iterdir())
