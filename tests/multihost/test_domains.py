"""Failure domains end to end: four storage hosts in two "racks", node ids numbered rack by rack
(the order that put most chains inside one rack). Every chain spans both racks, so with the
whole of rack a cut off every file stays readable and new writes go on."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import urllib.request
from collections.abc import Iterator

import pytest

import loomfs
from loomfs.testing import netns
from loomfs.testing.netns_cluster import NetnsCluster
from loomfs.wire.types import NodeKind, NodeState

pytestmark = [pytest.mark.integration]

RACKS = {"storage1": "a", "storage2": "a", "storage3": "b", "storage4": "b"}


@pytest.fixture
def cluster() -> Iterator[NetnsCluster]:
    why = netns.available()
    if why:
        pytest.skip(why)
    root = tempfile.mkdtemp(prefix="loomfs-dom-")
    with netns.NetnsLab() as lab:
        c = NetnsCluster(root, lab, domains=RACKS, storage_nodes=4, targets_per_node=2, replicas=2,
                         lease_s=3.0, heartbeat_interval_s=0.5)
        try:
            c.start(timeout_s=90)
            yield c
        finally:
            c.stop()
    shutil.rmtree(root, ignore_errors=True)


def test_chains_span_racks_and_survive_a_whole_rack_cut_off(cluster: NetnsCluster) -> None:
    c = cluster
    r = c.routing()
    rack_of = {s.node_id: RACKS[s.name] for s in c.services.values() if s.kind == "storage"}
    # routing shows each storage node's label (what `loomfs admin nodes` prints)
    assert {n.node_id: n.domain for n in r.nodes if n.kind == NodeKind.STORAGE} == rack_of
    node_of = {t.target_id: t.node_id for t in r.targets}
    assert len(r.chains) == 4
    assert all({rack_of[node_of[t]] for t in ch.targets} == {"a", "b"} for ch in r.chains)
    urls = {row["name"]: row["metrics"] for row in c.status()}  # each on its own host, scraped over the bridge
    assert urls["storage4"] == f"http://{c.host('storage4').address}:8201/metrics"
    assert b"loomfs_" in urllib.request.urlopen(urls["storage4"], timeout=10).read()
    data = os.urandom(6 << 20)  # 2 chunks of 4 MiB: two chains
    with loomfs.connect(str(c.root)) as fs:
        fs.pipe("/before", data)
        for name in ("storage1", "storage2"):
            c.cut_host(name)
        end = time.monotonic() + 20
        while not all(n.state != NodeState.ALIVE for n in c.routing().nodes
                      if n.kind == NodeKind.STORAGE and rack_of[n.node_id] == "a"):
            assert time.monotonic() < end, "mgmtd did not mark rack a dead"
            time.sleep(0.1)
        assert fs.cat("/before") == data
        fs.pipe("/during", data[:1 << 20])
        assert fs.cat("/during") == data[:1 << 20]
