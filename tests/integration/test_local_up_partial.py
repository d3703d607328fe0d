"""Issue 15 item 2: ``loomfs local up`` on a partly running cluster starts what is missing
(it used to fail with "already running"); ``local status`` exits non-zero and says what is
down and how to fix it."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from loomfs.cli.main import main
from loomfs.testing import LocalCluster
from loomfs.wire.types import NodeKind, NodeState

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_local_up_restarts_what_is_missing(own_cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    root = str(own_cluster.root)
    own_cluster.kill_service("storage2")
    assert main(["local", "status", "--dir", root]) == 3
    err = capsys.readouterr().err
    assert "not running: storage2" in err and "loomfs local up" in err
    assert main(["local", "up", "--dir", root]) == 0
    assert "starting storage2" in capsys.readouterr().out
    assert main(["local", "status", "--dir", root]) == 0
    node = own_cluster.services["storage2"].node_id
    own_cluster.wait_routing(lambda r: any(n.node_id == node and n.kind == NodeKind.STORAGE
                                           and n.state == NodeState.ALIVE for n in r.nodes), 30, "storage2 back")
    # the restarted process belongs to the cluster directory's state, not to this fixture's object
    LocalCluster.from_dir(root).stop_service("storage2")


def test_a_restart_with_a_port_taken_says_so(own_cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    """``local up`` of a stopped cluster whose storage port was taken meanwhile: it used to print
    that storage "running" and exit 0 (mgmtd still listed the node from before) while the
    process had died with EADDRINUSE. Now it refuses with the port, keeps the cluster's state,
    and starts once the port is free again. (The restart goes through the fixture's own object,
    so that its stop puts this process's token variable back for the tests after this one.)"""
    root = str(own_cluster.root)
    own_cluster.stop()
    port = own_cluster.services["storage2"].port
    try:
        with socket.socket() as s:
            # the stopped service's connections may linger in TIME_WAIT on its port: a listener
            # with SO_REUSEADDR binds anyway, as the service itself would
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
            s.listen()
            assert main(["local", "up", "--dir", root]) != 0
            err = capsys.readouterr().err
            assert "ports already in use" in err and str(port) in err and "Traceback" not in err
            assert (own_cluster.root / "cluster.json").exists()
            assert not any(x.alive() for x in LocalCluster.from_dir(root).services.values())
        own_cluster.start()
        assert main(["local", "status", "--dir", root]) == 0
    except BaseException:
        LocalCluster.from_dir(root).stop()  # whatever a failed check left running
        raise


def test_metrics_ports_follow_from_the_service_ports(cluster: LocalCluster) -> None:
    """Issue 15 item 11: every service's /metrics port is predictable from the base port
    (meta and storage: their port + 100; mgmtd: base + 9)."""
    from loomfs.testing.cluster import METRICS_OFFSET

    ports = {(n.host, n.port): n.metrics_port for n in cluster.routing().nodes}
    for s in cluster.services.values():
        if s.kind != "mgmtd":
            assert ports[("127.0.0.1", s.port)] == s.port + METRICS_OFFSET, s.name
    assert cluster.mgmtd_metrics_port == cluster.base_port + 9


def test_storage_registers_again_with_a_mgmtd_that_lost_its_store(own_cluster: LocalCluster) -> None:
    """mgmtd came back with a fresh store (its database lost): storage nodes get ENOENT for their
    heartbeats and register again. The check for that compared a StatusError the client never
    raises (it raises NotFound), so nodes heartbeated into the void forever. (Runs last in this
    module: the cluster has no chain table afterwards.)"""
    import glob
    import os

    own_cluster.stop_service("mgmtd")
    for f in glob.glob(os.path.join(own_cluster.services["mgmtd"].dir, "*.db*")) + glob.glob(
            os.path.join(own_cluster.services["mgmtd"].dir, "*.sqlite*")):
        os.unlink(f)
    own_cluster.start_service("mgmtd")
    own_cluster.wait_listening("mgmtd")
    n = sum(1 for s in own_cluster.services.values() if s.kind == "storage" and s.alive())
    own_cluster.wait_routing(lambda r: sum(1 for x in r.nodes if x.kind == NodeKind.STORAGE
                                           and x.state == NodeState.ALIVE) == n, 30, "storage nodes registered again")


def test_local_up_with_its_ports_taken_leaves_nothing_to_trip_over(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A first ``local up`` whose ports are taken fails with the reason; it used to leave a
    cluster.json with no services behind, and the next ``local up`` there died in a traceback
    (no admin token) instead of saying the ports were still taken."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        root = tmp_path / "c"
        for _ in range(2):
            assert main(["local", "up", "--dir", str(root), "--base-port", str(port)]) != 0
            err = capsys.readouterr().err
            assert "ports already in use" in err and str(port) in err and "Traceback" not in err
            assert not (root / "cluster.json").exists()
