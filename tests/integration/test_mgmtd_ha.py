"""mgmtd failover by lease (issue 12 item 3): two mgmtd processes on one PostgreSQL store.

Three mgmtd. A client writes and reads files while the primary mgmtd is killed with SIGKILL:
a standby takes over within one lease, no error reaches the client, storage nodes keep their
leases (writes go on past a node lease after the kill), the routing version has grown, and
every service and client follows the new primary. Then the new primary is paused (SIGSTOP):
the last one takes over, and the paused one, resumed, answers NOT_PRIMARY naming it. And:
the lease SQL on its own; SQLite with two mgmtd addresses is refused at start.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import tomli_w

import loomfs
from loomfs.errors import LoomError
from loomfs.mgmtd.pgstore import PgHaStore
from loomfs.mgmtd.state import ClusterState
from loomfs.net.rpc import RpcClient
from loomfs.net.tcp import TcpTransport
from loomfs.net.transport import Address
from loomfs.testing import LocalCluster
from loomfs.testing.pgserver import PgServer
from loomfs.wire import mgmtd as wm
from loomfs.wire.status import Status
from loomfs.wire.types import NodeKind

pytestmark = [pytest.mark.integration]

PRIMARY_LEASE_S = 1.0
NODE_LEASE_S = 3.0


@pytest.fixture
def ha_cluster(pg_server: PgServer, request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    root = tempfile.mkdtemp(prefix="loomfs-mgmtdha-")
    c = LocalCluster(root, mgmtd_servers=3, mgmtd_store=pg_server.url(schema=f"mgmtdha{os.getpid()}"),
                     mgmtd_config={"primary_lease_s": PRIMARY_LEASE_S}, storage_nodes=2, targets_per_node=1,
                     replicas=2, lease_s=NODE_LEASE_S, heartbeat_interval_s=0.5, gc_delay_s=1.0)
    try:
        c.start(timeout_s=60)
    except BaseException:
        _dump(c)
        c.stop()
        raise
    yield c
    c.stop()
    if getattr(request.node, "_loomfs_failed", False) or getattr(request.session, "_loomfs_failed", False):
        _dump(c)
    else:
        shutil.rmtree(root, ignore_errors=True)


def _dump(c: LocalCluster) -> None:
    for s in c.services.values():
        if os.path.exists(s.log_path):
            with open(s.log_path, errors="replace") as f:
                print(f"----- {s.name} -----\n{f.read()[-3000:]}")


async def _routing_version(address: str) -> int:
    """The routing version ``address`` serves; raises when it is not (or not yet) primary."""
    rpc = RpcClient(TcpTransport(), connect_timeout_s=0.5)
    try:
        rsp = await rpc.call(Address.parse(address), wm.GET_ROUTING, wm.GetRoutingReq(), timeout_s=1.0, retry=False)
        assert rsp.body.routing is not None
        return int(rsp.body.routing.version)
    finally:
        await rpc.close()


def _status_of(address: str) -> Status | None:
    try:
        asyncio.run(_routing_version(address))
    except LoomError as exc:
        return exc.status
    return Status.OK


def _wait_primary(candidates: list[str], since_s: float) -> str:
    """The first of ``candidates`` to answer as primary; fails after a lease plus slack."""
    while True:
        for a in candidates:
            if _status_of(a) is Status.OK:
                return a
        assert time.monotonic() < since_s + PRIMARY_LEASE_S + 5.0, "no standby took over"
        time.sleep(0.02)


def test_standby_takes_over_when_the_primary_is_killed(ha_cluster: LocalCluster) -> None:
    c = ha_cluster
    first, *standbys = (c.services[n].address for n in c.mgmtd_names)
    assert [_status_of(a) for a in standbys] == [Status.NOT_PRIMARY] * 2
    fs = loomfs.connect(str(c.root))  # cluster.json lists every mgmtd
    errors: list[BaseException] = []
    done: list[float] = []  # when each write+read finished
    stop = threading.Event()

    def work() -> None:
        i = 0
        while not stop.is_set():
            data = os.urandom(1000 + i)
            try:
                fs.pipe(f"/ha/f{i % 20}", data)
                assert fs.cat(f"/ha/f{i % 20}") == data
            except BaseException as exc:  # anything surfacing past the client's retries
                errors.append(exc)
                return
            done.append(time.monotonic())
            i += 1

    try:
        fs.makedirs("/ha", exist_ok=True)
        before = asyncio.run(_routing_version(first))
        t = threading.Thread(target=work)
        t.start()
        end = time.monotonic() + 30
        while len(done) < 5 and not errors and time.monotonic() < end:
            time.sleep(0.01)
        killed_s = time.monotonic()
        c.kill_service("mgmtd")
        second = _wait_primary(standbys, killed_s)
        took_s = time.monotonic() - killed_s
        after = asyncio.run(_routing_version(second))
        # writes go on past a whole node lease after the kill: the storage nodes renewed
        # their leases with the new primary (they refuse writes otherwise)
        end = time.monotonic() + NODE_LEASE_S + 1.0
        while time.monotonic() < end and not errors:
            time.sleep(0.05)
        stop.set()
        t.join(30)
        assert not errors, errors
        assert done[-1] > killed_s + NODE_LEASE_S
        print(f"takeover after {took_s:.2f}s (primary lease {PRIMARY_LEASE_S}s); routing v{before} -> v{after}; "
              f"{len(done)} write+read pairs, none failed")
        # within one lease of the primary's last renewal (plus this loaded machine's slack)
        assert took_s <= PRIMARY_LEASE_S + 1.5
        assert after > before
        # the client follows the new primary at its next routing refresh
        routing = fs._ensure().routing
        assert routing is not None
        mgmtd = routing.mgmtd_set
        end = time.monotonic() + 10
        while mgmtd.primary != Address.parse(second) and time.monotonic() < end:
            time.sleep(0.05)
        assert mgmtd.primary == Address.parse(second)
        assert routing.current.version >= after

        # a gray failure: the new primary hangs; the last mgmtd takes over
        third = next(a for a in standbys if a != second)
        paused = next(n for n in c.mgmtd_names if c.services[n].address == second)
        paused_s = time.monotonic()
        c.pause_service(paused)
        try:
            assert _wait_primary([third], paused_s) == third
            took2_s = time.monotonic() - paused_s
        finally:
            c.resume_service(paused)
        # resumed past its lease, it knows it is not primary any more (its local deadline
        # passed), and names the new one once it has read the lease row
        end = time.monotonic() + 5
        while True:
            try:
                asyncio.run(_routing_version(second))
                raise AssertionError("the paused mgmtd answered as primary after resuming")
            except LoomError as exc:
                assert exc.status is Status.NOT_PRIMARY
                if "primary=" + third in str(exc) or time.monotonic() > end:
                    assert "primary=" + third in str(exc), exc
                    break
            time.sleep(0.05)
        last = asyncio.run(_routing_version(third))
        assert last > after
        fs.pipe("/ha/after-pause", b"x")
        assert fs.cat("/ha/after-pause") == b"x"
        print(f"second takeover (primary paused) after {took2_s:.2f}s; routing v{after} -> v{last}")
        assert took2_s <= PRIMARY_LEASE_S + 1.5
    finally:
        stop.set()
        fs.close()


def test_sqlite_with_two_mgmtd_addresses_is_refused_at_start(tmp_path: Any) -> None:
    cfg = tmp_path / "mgmtd.toml"
    with open(cfg, "wb") as f:
        tomli_w.dump({"port": 0, "data_dir": str(tmp_path), "store_url": "sqlite:///mgmtd.db",
                      "mgmtd": "127.0.0.1:7001,127.0.0.1:7002", "metrics_port": -1}, f)
    r = subprocess.run([sys.executable, "-m", "loomfs.mgmtd.server", "--config", str(cfg)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "several mgmtd need one shared postgresql:// store_url" in r.stderr


def test_pg_store_lease_and_conditional_saves(pg_server: PgServer) -> None:
    """The SQL itself: one holder at a time, saves refused to anyone else, a release hands
    over at once, a load bumps the version."""
    url = pg_server.url(schema=f"mgmtdsql{os.getpid()}")

    async def run() -> None:
        a, b = PgHaStore(url), PgHaStore(url)
        try:
            assert (await a.acquire("a", "10.0.0.1:8000", 30.0)).held
            view = await b.acquire("b", "10.0.0.2:8000", 30.0)
            assert not view.held and view.address == "10.0.0.1:8000"
            st = ClusterState(lease_s=5.0)
            st.register(node_id=1, kind=NodeKind.STORAGE, host="127.0.0.1", port=9001, targets=[], now_s=0.0)
            assert await a.save(st, "a")
            saved_version = st.version
            st.register(node_id=2, kind=NodeKind.STORAGE, host="127.0.0.1", port=9002, targets=[], now_s=0.0)
            assert not await b.save(st, "b")  # not the holder: nothing written
            assert (await a.acquire("a", "10.0.0.1:8000", 30.0)).held  # renewal
            await a.release("a")
            assert (await b.acquire("b", "10.0.0.2:8000", 30.0)).held  # at once, not after 30 s
            assert not await a.save(st, "a")  # deposed
            loaded = ClusterState(lease_s=5.0)
            await b.load(loaded, now_s=0.0)
            assert set(loaded.nodes) == {1} and loaded.version == saved_version + 1
            assert (await a.acquire("a", "10.0.0.1:8000", 30.0)).address == "10.0.0.2:8000"
        finally:
            await a.close()
            await b.close()

    asyncio.run(run())


def test_local_up_refuses_several_mgmtd_without_a_postgresql_store(tmp_path: Any) -> None:
    r = subprocess.run([sys.executable, "-m", "loomfs.cli.main", "local", "up", "--dir", str(tmp_path / "c"),
                        "--mgmtd-servers", "2"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "--mgmtd-servers above 1 needs --mgmtd-store postgresql://" in r.stderr
