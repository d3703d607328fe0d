"""`loomfs local add-node` + `loomfs admin drain NODE`: replicas move off, the node goes away."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from faultkit import start_cluster
from test_storage_kill import _assert_replicas_agree, _run_workload

import loomfs
from loomfs.testing import LocalCluster

pytestmark = [pytest.mark.integration]


def _cli(*args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "loomfs.cli.main", *args], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


@pytest.mark.timeout(180)
def test_add_node_then_drain_and_remove(make_cluster: list[LocalCluster], seed: int) -> None:
    c = start_cluster("drain")
    make_cluster.append(c)
    fs = loomfs.connect(str(c.root))
    try:
        w = _run_workload(fs, "/w", seed)
        time.sleep(1.0)
        out = _cli("local", "add-node", "--dir", str(c.root))
        assert "storage4" in out
        c2 = LocalCluster.from_dir(c.root)  # add-node recorded the new process in cluster.json
        assert "storage4" in c2.services
        c.services = c2.services
        t0 = time.monotonic()
        out = _cli("--dir", str(c.root), "admin", "drain", "1", "--wait", "--timeout-s", "90")
        drain_s = time.monotonic() - t0
        assert "holds no replica" in out
        r = c.routing()
        assert c.fully_replicated(r)
        assert not [t for t in r.targets if t.node_id == 1 and t.chain_id]
        c.stop_service("storage1")  # remove the drained node: no loss of redundancy
        time.sleep(1.0)
        stats = w.stop()
        print(f"[fault] drain: node 1 emptied in {drain_s:.2f}s; workload longest op {stats.max_op_s:.2f}s")
        assert stats.errors == []
        assert w.verify_all() == []
        assert c.fully_replicated()
        _assert_replicas_agree(c)
        targets = _cli("--dir", str(c.root), "admin", "targets")
        assert "spare" in targets
    finally:
        fs.close()
