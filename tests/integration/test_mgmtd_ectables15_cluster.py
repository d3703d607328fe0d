"""A real one-replica local cluster (a replicated table, not EC) with a spare node: a reboot of
the storage node that outlasts lease + replace_after_s keeps its target in the chain (the old
mgmtd swapped the empty spare in and the data was gone); a wiped disk makes the chain wait until
``loomfs admin chain accept-loss CHAIN --yes-lose-data`` lets it serve again, empty."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import loomfs
from loomfs.testing import LocalCluster
from loomfs.wire.types import RoutingInfo, TargetState

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

S = TargetState
LEASE_S = 2.0
REPLACE_S = 2.0


@pytest.fixture(scope="module")
def c1() -> Iterator[LocalCluster]:
    root = tempfile.mkdtemp(prefix="loomfs-it-ectables-")
    c = LocalCluster(root, storage_nodes=1, targets_per_node=1, replicas=1, lease_s=LEASE_S,
                     heartbeat_interval_s=0.5, gc_delay_s=1.0, replace_after_s=REPLACE_S)
    try:
        c.start(timeout_s=60)
        c.add_storage_node()  # storage2: its target is a spare
        yield c
    finally:
        c.stop()
    shutil.rmtree(root, ignore_errors=True)


def _tid(c: LocalCluster) -> int:
    return c.services["storage1"].node_id * 1000 + 1


def _chain(r: RoutingInfo, tid: int) -> int:
    return next(t.chain_id for t in r.targets if t.target_id == tid)


def _state(r: RoutingInfo, tid: int) -> int:
    return next(t.state for t in r.targets if t.target_id == tid)


def _admin(c: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("loomfs")
    return subprocess.run([str(exe), "admin", *args, "-C", str(c.root)], capture_output=True, text=True,
                          timeout=60, check=False)


def test_a_reboot_longer_than_replace_after_keeps_the_data(c1: LocalCluster) -> None:
    fs = loomfs.connect(str(c1.root))
    data = os.urandom((1 << 20) + 99)
    with fs.open("/keep.bin", "wb") as f:
        f.write(data)
    tid = _tid(c1)
    chain = _chain(c1.routing(), tid)
    c1.kill_service("storage1")
    c1.wait_routing(lambda r: _state(r, tid) == S.LASTSRV, 30, "storage1 lost")
    time.sleep(LEASE_S + REPLACE_S + 3.0)  # mgmtd ticks over it many times
    r = c1.routing()
    assert next(ch.targets for ch in r.chains if ch.chain_id == chain) == [tid]  # no empty spare swapped in
    c1.start_service("storage1")
    c1.wait_routing(lambda r: _state(r, tid) == S.SERVING, 60, "storage1 serving again")
    assert fs.cat("/keep.bin") == data
    fs.close()


def test_a_wiped_single_replica_chain_serves_again_only_when_the_loss_is_accepted(c1: LocalCluster) -> None:
    tid = _tid(c1)
    chain = _chain(c1.routing(), tid)
    d = Path(c1.services["storage1"].dir, "target1")
    c1.kill_service("storage1")
    shutil.rmtree(d)
    d.mkdir()
    c1.start_service("storage1")
    # the chain's only (newest) copy is gone: the empty target stays lastsrv, blank (the loss's
    # marker: never serving), not swapped, not served
    c1.wait_routing(lambda r: _state(r, tid) == S.LASTSRV, 30, "the empty target waiting")
    time.sleep(1.0)
    assert _state(c1.routing(), tid) == S.LASTSRV
    refused = _admin(c1, "chain", "accept-loss", str(chain))
    assert refused.returncode != 0 and "--yes-lose-data" in refused.stderr
    ok = _admin(c1, "chain", "accept-loss", str(chain), "--yes-lose-data")
    assert ok.returncode == 0, ok.stderr
    assert f"serves from empty target {tid}" in ok.stdout
    c1.wait_routing(lambda r: _state(r, tid) == S.SERVING, 30, "the chain serving again")
    fs = loomfs.connect(str(c1.root))
    fresh = os.urandom(4096 + 5)
    with fs.open("/after.bin", "wb") as f:
        f.write(fresh)
    assert fs.cat("/after.bin") == fresh
    fs.close()
    again = _admin(c1, "chain", "accept-loss", str(chain), "--yes-lose-data")
    assert again.returncode != 0  # it serves from a member that is not blank now: refused
