"""Token revocations with two mgmtd on one PostgreSQL store (issue 13, docs/mgmtd-ha.md): a
token revoked on the primary stays revoked after the primary is killed and the standby takes
over (the list is in the shared store, not in a file of the dead process), and services keep
refusing it once they poll the new primary; a revocation made on the new primary reaches them.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import loomfs
from loomfs.common.routing import MgmtdSet, parse_addresses
from loomfs.config import ClientConfig, RpcConfig
from loomfs.net.auth import AuthConfig
from loomfs.net.credentials import create_token, load_secret_file, write_token_file
from loomfs.net.rpc import RpcClient
from loomfs.net.tcp import TcpTransport
from loomfs.testing import LocalCluster
from loomfs.testing.pgserver import PgServer
from loomfs.wire import auth as wa
from loomfs.wire.message import Empty

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture
def ha(pg_server: PgServer, request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    root = tempfile.mkdtemp(prefix="loomfs-harevoke-")
    c = LocalCluster(root, mgmtd_servers=2, mgmtd_store=pg_server.url(schema=f"harevoke{os.getpid()}"),
                     mgmtd_config={"primary_lease_s": 1.0}, storage_nodes=1, targets_per_node=1, replicas=1,
                     lease_s=3.0, heartbeat_interval_s=0.5)
    try:
        c.start(timeout_s=60)
        yield c
    finally:
        c.stop()
    if not getattr(request.session, "_loomfs_failed", False):
        shutil.rmtree(root, ignore_errors=True)


def _mgmtd_call(c: LocalCluster, m: Any, req: Any) -> Any:
    async def go() -> Any:
        # as a service (LIST_REVOKED is for services; REVOKE_TOKEN needs ADMIN, which SERVICE holds)
        rpc = RpcClient(TcpTransport(auth=AuthConfig(secret=load_secret_file(c.secret_path))), connect_timeout_s=1.0)
        try:
            return (await MgmtdSet(rpc, parse_addresses(c.mgmtd_addresses)).call(m, req, timeout_s=2.0,
                                                                                  deadline_s=15.0)).body
        finally:
            await rpc.close()

    return asyncio.run(go())


def _refused(fs: loomfs.LoomFS) -> bool:
    try:
        fs.stat("/")
    except PermissionError:
        return True
    return False


def _until(ok: Callable[[], bool], timeout_s: float, what: str) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if ok():
            return time.monotonic() - start
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout_s}s: {what}")


def test_a_revocation_outlives_the_primary(ha: LocalCluster, tmp_path: Path) -> None:
    secret = load_secret_file(ha.secret_path)
    clients: list[loomfs.LoomFS] = []

    def user() -> tuple[str, loomfs.LoomFS]:
        cred = create_token(secret, uid=1000, gid=1000, ttl_s=600, now_s=time.time())
        path = tmp_path / f"{cred.claims.token_id}.token"
        write_token_file(path, cred)
        fs = loomfs.connect(str(ha.root), config=ClientConfig(rpc=RpcConfig(token_file=str(path))))
        clients.append(fs)
        fs.stat("/")  # connected and accepted
        return cred.claims.token_id, fs

    try:
        id1, u1 = user()
        id2, u2 = user()
        rsp = _mgmtd_call(ha, wa.REVOKE_TOKEN, wa.RevokeTokenReq(token_id=id1))
        assert id1 in rsp.token_ids
        _until(lambda: _refused(u1), 15.0, "meta refuses the revoked token")
        ha.kill_service("mgmtd")  # the primary (the first to start)
        listed = _mgmtd_call(ha, wa.LIST_REVOKED, Empty())  # answered by the standby, now primary
        assert id1 in listed.token_ids, "the new primary lost the revocation"
        _mgmtd_call(ha, wa.REVOKE_TOKEN, wa.RevokeTokenReq(token_id=id2))
        took_s = _until(lambda: _refused(u2), 15.0, "a revocation on the new primary reaches meta")
        # meta now polls the new primary's list: the first token is still refused
        assert _refused(u1)
        _, fresh = user()  # an unrevoked token still works
        assert not _refused(fresh)
        print(f"revocation on the new primary refused by meta after {took_s:.1f}s")
    finally:
        for fs in clients:
            fs.close()
