"""``loomfs bench --only ec`` (issue 11 item 8): its rows, units and limits (never speed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROWS = {"ec_encode_4+2", "ec_encode_10+4", "rep3_write", "rep3_read", "ec_write", "ec_read",
        "rep3_space", "ec_space", "ec_read_degraded_1", "ec_read_degraded_m"}


def test_bench_only_ec(cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "ec.json"
    proc = subprocess.run(
        [sys.executable, "-m", "loomfs.cli.main", "--dir", str(cluster.root), "bench", "--quick",
         "--only", "ec", "--json", str(out), "--no-progress"],
        capture_output=True, text=True, timeout=280,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["plan"]["groups"] == ["ec"] and doc["plan"]["ec_bytes"] == 32 << 20
    rows = {r["name"]: r for r in doc["results"]}
    assert set(rows) == ROWS, set(rows) ^ ROWS
    for r in rows.values():
        assert r["value"] > 0, r
    assert rows["ec_write"]["limit_value"] == rows["rep3_write"]["value"]
    assert rows["ec_read"]["limit_value"] == rows["rep3_read"]["value"]
    for name in ("ec_read_degraded_1", "ec_read_degraded_m"):
        assert rows[name]["limit_value"] == rows["ec_read"]["value"]
    assert rows["ec_encode_4+2"]["limit_value"] == doc["limits"]["memcpy_Bps"]
    # 32 MiB in 4 MiB stripes: 1.5x the data plus 64 bytes a fragment; 3 replicas: 3x
    assert rows["ec_space"]["value"] == pytest.approx(150, abs=0.5)
    assert rows["rep3_space"]["value"] == pytest.approx(300, abs=0.5)
