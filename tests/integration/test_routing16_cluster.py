"""A real one-node cluster with two single-replica tables: a replicated one (table 1) and an EC
group's (table 2). Routing says which is which (``ChainTable.ec``: ``loomfs admin tables``), and
a target wiped while its node was down shows as blank (``TargetInfo.blank``, with its new format
id) in ``loomfs admin targets`` and ``admin chains`` until an operator accepts the loss."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from loomfs.storage.diskident import read_format_id
from loomfs.testing import LocalCluster
from loomfs.wire.types import RoutingInfo, TargetInfo, TargetState

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

S = TargetState


@pytest.fixture(scope="module")
def c1() -> Iterator[LocalCluster]:
    root = tempfile.mkdtemp(prefix="loomfs-it-routing16-")
    c = LocalCluster(root, storage_nodes=1, targets_per_node=1, replicas=1, ec_targets_per_node=1, lease_s=2.0,
                     heartbeat_interval_s=0.5, gc_delay_s=1.0)
    try:
        c.start(timeout_s=60)
        yield c
    finally:
        c.stop()
    shutil.rmtree(root, ignore_errors=True)


def _admin(c: LocalCluster, *args: str) -> str:
    exe = Path(sys.executable).with_name("loomfs")
    p = subprocess.run([str(exe), "admin", *args, "-C", str(c.root)], capture_output=True, text=True, timeout=60,
                       check=False, env={**os.environ, "COLUMNS": "300"})
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def _target(r: RoutingInfo, tid: int) -> TargetInfo:
    return next(t for t in r.targets if t.target_id == tid)


def test_admin_tables_tells_the_ec_table_from_the_replicated_one_replica_table(c1: LocalCluster) -> None:
    rows = json.loads(_admin(c1, "tables", "--json"))
    assert [(r["table"], r["replicas"], r["ec"]) for r in rows] == [(1, 1, False), (2, 1, True)]
    assert [t.ec for t in c1.routing().tables] == [False, True]


def test_a_wiped_target_shows_blank_until_the_loss_is_accepted(c1: LocalCluster) -> None:
    tid = c1.services["storage1"].node_id * 1000 + 1
    assert not any(t.blank for t in c1.routing().targets)
    d = Path(c1.services["storage1"].dir, "target1")
    c1.kill_service("storage1")
    shutil.rmtree(d)
    d.mkdir()
    c1.start_service("storage1")
    c1.wait_listening("storage1", 30)
    r = c1.wait_routing(lambda r: _target(r, tid).blank, 30, "the wiped target blank")
    new_id = read_format_id(d)
    t = _target(r, tid)
    assert t.format_id == new_id and t.state == S.LASTSRV
    rows = {x["target"]: x for x in json.loads(_admin(c1, "targets", "--json"))}
    assert rows[tid]["blank"] is True and rows[tid]["format_id"] == new_id and rows[tid]["state"] == "lastsrv"
    text = _admin(c1, "targets")
    line = next(x for x in text.splitlines() if f" {tid} " in x)
    assert "blank: disk replaced" in line, text
    assert f"{tid}(lastsrv, blank)" in _admin(c1, "chains")
    chain = t.chain_id
    _admin(c1, "chain", "accept-loss", str(chain), "--yes-lose-data")
    r = c1.wait_routing(lambda r: _target(r, tid).state == S.SERVING, 30,
                        "the chain serving again")
    assert not _target(r, tid).blank
    assert json.loads(_admin(c1, "targets", "--json"))[0]["blank"] is False
