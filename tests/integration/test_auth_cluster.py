"""Authentication against a real cluster (issue 13 items 1, 2, 6): services share a secret,
clients prove tokens; missing, forged, expired, replayed and revoked credentials are refused with
a status and logged; non-admin tokens cannot drain, fence or create chain tables; storage takes
chunk writes from clients only with meta's write grant for the inode."""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import loomfs
from loomfs.client.storage_client import StorageClient
from loomfs.common import grants
from loomfs.common.routing import RoutingClient, parse_addresses
from loomfs.config import ClientConfig, RpcConfig
from loomfs.errors import PermissionDenied
from loomfs.net.auth import AuthConfig, client_proof, new_nonce
from loomfs.net.credentials import (
    Credential,
    create_token,
    load_secret_file,
    load_token_file,
    rights_for,
    write_token_file,
)
from loomfs.net.rpc import RpcClient
from loomfs.net.tcp import TcpTransport
from loomfs.net.transport import Address
from loomfs.testing import LocalCluster
from loomfs.testing.rawauth import _exchange
from loomfs.wire import auth as wa
from loomfs.wire import mgmtd as wm
from loomfs.wire.message import Empty
from loomfs.wire.status import Status
from loomfs.wire.storage import STORAGE_PING
from loomfs.wire.types import Layout

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def auth_cluster() -> Iterator[LocalCluster]:
    root = Path(tempfile.mkdtemp(prefix="loomfs-it-auth-"))
    revoked = str(root / "revoked")
    rpc = {"revoked_file": revoked}
    c = LocalCluster(root, storage_nodes=3, targets_per_node=1, mgmtd_config={"rpc": rpc},
                     storage_config={"rpc": rpc})  # write grants required: the default with a secret
    try:
        c.start(timeout_s=60)
        yield c
    finally:
        c.stop()


def _secret(c: LocalCluster) -> bytes:
    return load_secret_file(c.secret_path)


def _token(c: LocalCluster, *, admin: bool = False, read_only: bool = False, now_s: float | None = None) -> Credential:
    return create_token(_secret(c), uid=1000, gid=1000, rights=rights_for(admin=admin, read_only=read_only),
                        ttl_s=3600, now_s=time.time() if now_s is None else now_s)


def _rpc(auth: AuthConfig | None) -> RpcClient:
    return RpcClient(TcpTransport(auth=auth), connect_timeout_s=2.0, call_timeout_s=10.0)


async def _call(auth: AuthConfig | None, address: str, m: Any, req: Any, **kw: Any) -> Any:
    rpc = _rpc(auth)
    try:
        return (await rpc.call(Address.parse(address), m, req, **kw)).body
    finally:
        await rpc.close()


def _refused(auth: AuthConfig | None, address: str, m: Any = wm.GET_ROUTING, req: Any = None) -> PermissionDenied:
    with pytest.raises(PermissionDenied) as ei:
        asyncio.run(_call(auth, address, m, req if req is not None else wm.GetRoutingReq(), retry=False))
    return ei.value


def _wait_log(c: LocalCluster, name: str, text: str, timeout_s: float = 10.0) -> None:
    path = Path(c.services[name].log_path)
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if text in path.read_text(errors="replace"):
            return
        time.sleep(0.05)
    raise AssertionError(f"{text!r} not in {name}'s log")


def test_credentials_are_private_and_the_admin_token_works(auth_cluster: LocalCluster) -> None:
    c = auth_cluster
    for p in (c.secret_path, c.token_path):
        assert os.stat(p).st_mode & 0o777 == 0o600
    assert os.environ.get("LOOMFS_TOKEN_FILE") == str(c.token_path)  # this process's clients use it
    body = asyncio.run(_call(c.client_auth(), c.mgmtd_address, wm.GET_ROUTING, wm.GetRoutingReq()))
    assert body.routing.chains


def test_missing_forged_expired_replayed_and_revoked_credentials_are_refused_and_logged(
        auth_cluster: LocalCluster, tmp_path: Path) -> None:
    c, mg = auth_cluster, auth_cluster.mgmtd_address
    assert _refused(None, mg).status is Status.AUTH_REQUIRED
    good = _token(c)
    forged = Credential(good.claims.__class__(**{**_claims(good), "uid": 0}), good.key)  # uid 0, same key
    assert _refused(AuthConfig(credential=forged), mg).status is Status.AUTH_FAILED
    expired = _token(c, now_s=time.time() - 7200)
    err = _refused(AuthConfig(credential=expired), mg)
    assert err.status is Status.AUTH_EXPIRED and err.errno == errno.EACCES
    assert _refused(AuthConfig(secret=b"another cluster's secret 32 byte"), mg).status is Status.AUTH_FAILED
    # replay: a proof seen on one connection, presented on another (a new server nonce)
    host, port = mg.rsplit(":", 1)
    cn = new_nonce()
    with socket.create_connection((host, int(port)), timeout=5) as a:
        hello = wa.HelloRsp.from_wire(_exchange(a, 1, wa.HELLO, wa.HelloReq(client_nonce=cn).to_wire()).body)
        prove = wa.ProveReq(claims=good.claims.to_wire(), proof=client_proof(good.key, hello.server_nonce, cn))
        assert _exchange(a, 2, wa.PROVE, prove.to_wire()).status == Status.OK
    with socket.create_connection((host, int(port)), timeout=5) as b:
        _exchange(b, 1, wa.HELLO, wa.HelloReq(client_nonce=cn).to_wire())
        assert _exchange(b, 2, wa.PROVE, prove.to_wire()).status == Status.AUTH_FAILED
    # revocation: the token id in the services' revoked_file
    victim = _token(c)
    asyncio.run(_call(AuthConfig(credential=victim), mg, wm.MGMTD_PING, Empty()))
    with open(c.root / "revoked", "a") as f:
        f.write(victim.claims.token_id + "\n")
    end = time.monotonic() + 10
    while True:  # the list is re-read at most once a second
        try:
            asyncio.run(_call(AuthConfig(credential=victim), mg, wm.MGMTD_PING, Empty(), retry=False))
        except PermissionDenied as exc:
            assert exc.status is Status.AUTH_REVOKED
            break
        assert time.monotonic() < end, "revoked token still accepted"
        time.sleep(0.2)
    for what in ("AUTH_REQUIRED", "AUTH_FAILED", "AUTH_EXPIRED", "AUTH_REVOKED", "replayed"):
        _wait_log(c, "mgmtd", what)


def _claims(cred: Credential) -> dict[str, Any]:
    cl = cred.claims
    return {f: getattr(cl, f) for f in cl.__slots__}  # type: ignore[attr-defined]


def test_non_admin_tokens_cannot_drain_fence_or_create_chain_tables(auth_cluster: LocalCluster) -> None:
    c, mg = auth_cluster, auth_cluster.mgmtd_address
    user = AuthConfig(credential=_token(c))
    calls = [(wm.DRAIN_NODE, wm.DrainReq(node_id=1, undrain=True)),
             (wm.CREATE_CHAIN_TABLE, wm.CreateChainTableReq(replicas=1)),
             (wm.REPORT_UNREACHABLE, wm.ReportUnreachableReq()),  # fences a target
             (wm.REGISTER_NODE, wm.RegisterNodeReq()), (wm.HEARTBEAT, wm.HeartbeatReq())]
    for m, req in calls:
        err = _refused(user, mg, m, req)
        assert err.errno == errno.EPERM and err.status is Status.EPERM, m.name
    admin_only = [(wm.REGISTER_NODE, wm.RegisterNodeReq())]  # services only, not even admins
    admin = AuthConfig(credential=_token(c, admin=True))
    for m, req in admin_only:
        assert _refused(admin, mg, m, req).errno == errno.EPERM
    asyncio.run(_call(admin, mg, wm.DRAIN_NODE, wm.DrainReq(node_id=1, undrain=True)))  # allowed
    _wait_log(c, "mgmtd", "drain_node needs")
    # the CLI: a user token file is refused, the cluster's admin token works
    tok = c.root / "user.token"
    write_token_file(tok, user.credential)  # type: ignore[arg-type]
    env = {**os.environ, "LOOMFS_TOKEN_FILE": str(tok)}
    cmd = [sys.executable, "-m", "loomfs.cli.main", "--dir", str(c.root), "admin", "drain", "1", "--undo"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "drain_node needs" in out.stdout + out.stderr, out
    env["LOOMFS_TOKEN_FILE"] = str(c.token_path)
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out


def test_storage_takes_client_writes_only_with_a_write_grant(auth_cluster: LocalCluster) -> None:
    c = auth_cluster
    routing = c.routing()
    chain = routing.chains[0]
    layout = Layout(chunk_size=1 << 20, chains=[chain.chain_id], table_id=chain.table_id)
    key = grants.grant_key(_secret(c))
    user, ro = _token(c), _token(c, read_only=True)
    inode = (1 << 40) + 7  # no such file: storage knows chunks, not files

    async def write(cred: Credential | None, grant: bytes, *, secret: bool = False) -> None:
        auth = AuthConfig(secret=_secret(c)) if secret else AuthConfig(credential=cred)
        rpc = _rpc(auth)
        try:
            sc = StorageClient(rpc, RoutingClient(rpc, parse_addresses(c.mgmtd_address)), 77,
                               call_timeout_s=10.0)
            await sc.routing.refresh()
            if grant:
                sc.write_grants[inode] = grant
            await sc.write_chunk(layout, inode, 0, 0, memoryview(b"data"))
        finally:
            await rpc.close()

    tid = user.claims.token_id
    asyncio.run(write(user, grants.mint(key, inode, tid, time.time() + 60)))  # granted: written
    refusals = [
        (b"", errno.EACCES),  # no grant
        (grants.mint(key, inode + 1, tid, time.time() + 60), errno.EACCES),  # another inode's
        (grants.mint(key, inode, "someone-else", time.time() + 60), errno.EACCES),  # another token's
        (grants.mint(grants.grant_key(b"z" * 32), inode, tid, time.time() + 60), errno.EACCES),  # forged
        (grants.mint(key, inode, tid, time.time() - 5), errno.EACCES),  # expired (AUTH_EXPIRED)
    ]
    for grant, code in refusals:
        with pytest.raises(PermissionError) as ei:
            asyncio.run(write(user, grant))
        assert ei.value.errno == code, grant
    with pytest.raises(PermissionError) as ei:  # a read-only token may not write, grant or not
        asyncio.run(write(ro, grants.mint(key, inode, ro.claims.token_id, time.time() + 60)))
    assert ei.value.errno == errno.EPERM
    asyncio.run(write(None, b"", secret=True))  # a service (chain peer, GC) needs no grant
    head = next(t for t in routing.targets if t.target_id == chain.targets[0])
    node = next(n for n in routing.nodes if n.node_id == head.node_id)
    name = next(s.name for s in c.services.values() if s.port == node.port)
    _wait_log(c, name, "refused a chunk change")


def test_a_user_token_writes_through_meta_grants_end_to_end(auth_cluster: LocalCluster, tmp_path: Path) -> None:
    """Meta grants the open, the client carries the grant, storage checks it (required here)."""
    c = auth_cluster
    with loomfs.connect(str(c.root)) as admin_fs:  # the admin token: a directory for uid 1000
        admin_fs.makedirs("/home/u1000", exist_ok=True)
        admin_fs.chown("/home/u1000", 1000, 1000)
    tok = tmp_path / "u1000.token"
    write_token_file(tok, _token(c))
    data = os.urandom(5 << 20)  # two chunks of 4 MiB: chunk writes, not inline
    cfg = ClientConfig(rpc=RpcConfig(token_file=str(tok)))
    with loomfs.connect(str(c.root), config=cfg) as fs:
        with fs.open("/home/u1000/big.bin", "wb") as f:
            f.write(data)
        with fs.open("/home/u1000/big.bin", "rb") as f:
            assert f.read() == data
        with fs.open("/home/u1000/big.bin", "r+b") as f:  # a second write open: a new grant
            f.seek(4 << 20)
            f.write(b"x" * 10)
        fs.truncate("/home/u1000/big.bin", 1 << 20)  # chunk removal of a file open nowhere
        assert fs.stat("/home/u1000/big.bin").st_size == 1 << 20
        # a grant past half its life is renewed with the write sessions
        key = grants.grant_key(_secret(c))
        tid = load_token_file(tok).claims.token_id
        with fs.open("/home/u1000/long.bin", "wb") as f:
            f.write(data[:4096])
            f.flush()
            inode = fs.stat("/home/u1000/long.bin").st_ino
            kept = fs.client.storage.write_grants  # type: ignore[attr-defined]
            kept[inode] = grants.mint(key, inode, tid, time.time() + 30)  # about to run out
            assert fs.run(fs.client.renew_sessions()) >= 1
            assert grants.expires_at_s(kept[inode]) > time.time() + grants.DEFAULT_GRANT_TTL_S - 60
            f.write(data)  # chunk writes with the fresh grant


def test_a_token_revoked_through_mgmtd_is_refused_by_every_service(auth_cluster: LocalCluster,
                                                                    tmp_path: Path) -> None:
    c = auth_cluster
    victim = _token(c)
    tok = tmp_path / "victim.token"
    write_token_file(tok, victim)
    storage = next(s for s in c.services.values() if s.kind == "storage")

    async def go() -> None:
        rpc = _rpc(AuthConfig(credential=victim))
        try:
            await rpc.call(Address.parse(storage.address), STORAGE_PING, Empty())  # an open connection
            cmd = [sys.executable, "-m", "loomfs.cli.main", "--dir", str(c.root), "admin", "token", "revoke",
                   str(tok)]
            res = await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True, timeout=60)
            assert res.returncode == 0, res
            end = time.monotonic() + 15  # storage polls mgmtd's list every 2 s
            while True:
                try:
                    await rpc.call(Address.parse(storage.address), STORAGE_PING, Empty(), retry=False)
                except PermissionDenied as exc:
                    assert exc.status is Status.AUTH_REVOKED
                    break
                assert time.monotonic() < end, "storage still takes the revoked token"
                await asyncio.sleep(0.2)
        finally:
            await rpc.close()

    asyncio.run(go())
    assert _refused(AuthConfig(credential=victim), c.mgmtd_address).status is Status.AUTH_REVOKED
    _wait_log(c, storage.name, "AUTH_REVOKED")


def test_token_create_cli_writes_a_private_token_that_clients_use(auth_cluster: LocalCluster, tmp_path: Path) -> None:
    c = auth_cluster
    out = tmp_path / "alice.token"
    cmd = [sys.executable, "-m", "loomfs.cli.main", "--dir", str(c.root), "admin", "token", "create",
           "--uid", "1001", "--gid", "1001", "--groups", "5,6", "--tenant", "alice", "--read-only",
           "--ttl", "2h", "-o", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res
    assert os.stat(out).st_mode & 0o777 == 0o600
    cred = load_token_file(out)
    assert (cred.claims.uid, cred.claims.groups, cred.claims.tenant) == (1001, (5, 6), "alice")
    assert 7000 < cred.claims.expires_at_s - time.time() <= 7200
    asyncio.run(_call(AuthConfig(credential=cred), c.mgmtd_address, wm.MGMTD_PING, Empty()))
