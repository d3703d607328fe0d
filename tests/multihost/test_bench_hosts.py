"""``loomfs bench --only hosts`` (issue 12 item 7): read throughput with 1 and 2 storage hosts in
network namespaces, each held against raw TCP over the same bridge in the same run; the text
curve and the plot come from the rows."""

from __future__ import annotations

import subprocess
from dataclasses import asdict
from pathlib import Path

import pytest

from loomfs.bench import hosts
from loomfs.testing import netns

pytestmark = [pytest.mark.integration]


def test_read_throughput_by_storage_hosts_with_the_raw_limit_of_the_same_run(tmp_path: Path) -> None:
    why = netns.available()
    if why:
        pytest.skip(why)
    before = _lab_names()
    steps: list[str] = []
    rows = hosts.run_hosts({}, size_bytes=8 << 20, step=steps.append, configs=(1, 2))
    assert len(steps) == hosts.steps((1, 2))
    assert [r.name for r in rows] == ["hosts_read_1storage", "hosts_read_2storage"]
    for r in rows:
        assert r.unit == "B/s" and r.value > 0 and r.limit_value > 0 and r.ratio is not None
        assert r.extra["storage_hosts"] in (1, 2) and r.extra["file_bytes"] == 8 << 20
    assert rows[0].extra["vs_1storage"] == 1.0
    doc = {"results": [{**asdict(r), "target": "loomfs"} for r in rows], "quick": True}
    text = hosts.curve_lines(doc)
    assert len(text) == 5 and text[-1].split()[0] == "2"
    png = tmp_path / "hosts.png"
    assert hosts.plot_curve(doc, str(png)) and png.read_bytes()[:4] == b"\x89PNG"
    assert not hosts.plot_curve({"results": []}, str(tmp_path / "none.png"))
    # nothing new of a closed lab is left (a concurrent run's live labs may come and go)
    left = {run for run in _lab_names() - before if not netns._run_alive(run)}
    assert not left, left


def _lab_names() -> set[str]:
    """Run ids of every lab namespace and link present now."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    runs = {m.group(1) for line in out.splitlines() if (m := netns.NS_RE.match(line.split()[0] if line else ""))}
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        m = netns.LINK_RE.match(line.split(":", 2)[1].strip().split("@")[0]) if line.count(":") >= 2 else None
        if m:
            runs.add(m.group(1))
    return runs
