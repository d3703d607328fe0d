"""Storage's tenant check (storage/tenantcheck.py): a token confined to a tenant reads, writes,
lists and removes only chunks of its tenant's inodes (tenant << 48 | n); services and admins
pass. Handlers called directly on a one-replica StorageService over a memory engine (no
sockets, virtual time)."""

from __future__ import annotations

import errno
from typing import Any

import crc32c
import pytest

from loomfs.common.identity import SERVICE, TENANT_SHIFT, TRUSTED, Identity, Right
from loomfs.errors import StatusError
from loomfs.net.rpc import CallContext, Reply, RpcClient
from loomfs.net.sim import SimNetwork
from loomfs.storage.engine.memory import MemoryEngine
from loomfs.storage.service import StorageService
from loomfs.storage.target import StorageTarget, target_id_for
from loomfs.storage.tenantcheck import TenantCheck
from loomfs.testing.routing import StaticRouting
from loomfs.testing.simloop import run_virtual
from loomfs.wire.status import Status
from loomfs.wire.storage import (
    ChunkId,
    QueryChunksReq,
    ReadReq,
    RemoveChunksReq,
    ReportCorruptReq,
    TruncateReq,
    WriteReq,
)
from loomfs.wire.types import ChainInfo, NodeInfo, NodeKind, RoutingInfo, TargetInfo, TargetState

TID = target_id_for(1, 0)
CHUNK_SIZE = 4 << 20
T2 = 2 << TENANT_SHIFT | 17  # an inode of tenant 2 ("alpha")
T3 = 3 << TENANT_SHIFT | 17  # the same number in tenant 3 ("beta")
SHARED = 17  # the shared namespace (tenant 0)
TENANTS = {"alpha": 2, "beta": 3}


USER = Right.user()


def _ident(tenant: str = "", rights: Right = USER) -> Identity:
    return Identity(uid=1000, gid=1000, tenant=tenant, rights=rights, token_id=f"tok-{tenant or 'shared'}")


def _ctx(identity: Identity, payload: bytes = b"") -> CallContext:
    return CallContext(payload=memoryview(payload), request_id=1, peer="test", deadline=None,
                       payload_crc=crc32c.crc32c(payload), identity=identity)


class Node:
    def __init__(self) -> None:
        self.asked: list[str] = []
        routing = StaticRouting(RoutingInfo(
            version=1, nodes=[NodeInfo(node_id=1, kind=NodeKind.STORAGE, host="n1", port=9000)],
            targets=[TargetInfo(target_id=TID, node_id=1, chain_id=1, state=TargetState.SERVING)],
            chains=[ChainInfo(chain_id=1, version=1, targets=[TID])]))
        rpc = RpcClient(SimNetwork(seed=1).transport("n1"))
        self.svc = StorageService([StorageTarget(TID, MemoryEngine())], routing, rpc)
        self.svc.tenant_check = TenantCheck(self._resolve)

    async def _resolve(self, name: str) -> int | None:
        self.asked.append(name)
        return TENANTS.get(name)

    async def write(self, inode: int, data: bytes, who: Identity = TRUSTED) -> None:
        req = WriteReq(chain_id=1, chain_version=1, chunk=ChunkId(inode=inode, index=0), offset=0,
                       length=len(data), chunk_size=CHUNK_SIZE, data_crc=crc32c.crc32c(data))
        await self.svc.write(req, _ctx(who, data))

    async def read(self, inode: int, who: Identity) -> bytes:
        req = ReadReq(chain_id=1, chain_version=1, chunk=ChunkId(inode=inode, index=0), length=CHUNK_SIZE,
                      target_id=TID)
        rsp = await self.svc.read(req, _ctx(who))
        assert isinstance(rsp, Reply)
        out = bytes(rsp.payload or b"")
        if rsp.on_sent is not None:
            rsp.on_sent()
        return out


def _refused(exc: pytest.ExceptionInfo[StatusError]) -> None:
    assert exc.value.status is Status.EACCES and exc.value.errno == errno.EACCES
    assert "outside tenant" in str(exc.value) or "does not exist" in str(exc.value)


def _run(body: Any) -> None:
    async def main() -> None:
        node = Node()
        try:
            await body(node)
        finally:
            await node.svc.rpc.close()

    run_virtual(main())


def test_a_tenant_reads_its_own_chunks_only() -> None:
    async def body(n: Node) -> None:
        for inode in (T2, T3, SHARED):
            await n.write(inode, f"data of {inode}".encode())
        alpha = _ident("alpha")
        assert await n.read(T2, alpha) == f"data of {T2}".encode()
        for inode in (T3, SHARED):
            with pytest.raises(StatusError) as ei:
                await n.read(inode, alpha)
            _refused(ei)
        # a tenant-less user token is confined to the shared namespace (tenant 0)
        shared = _ident("")
        assert await n.read(SHARED, shared) == f"data of {SHARED}".encode()
        with pytest.raises(StatusError) as ei:
            await n.read(T2, shared)
        _refused(ei)
        # services and admin tokens pass everywhere
        for who in (SERVICE, TRUSTED, _ident("", Right.user() | Right.ADMIN)):
            assert await n.read(T3, who) == f"data of {T3}".encode()
        assert n.asked == ["alpha"]  # meta asked once; later checks are a dict look-up
        assert n.svc.tenant_check.refused_total == 3
        assert "refused=3" in repr(n.svc.tenant_check)

    _run(body)


def test_writes_truncates_removals_listings_and_reports_are_confined() -> None:
    async def body(n: Node) -> None:
        await n.write(T3, b"beta's")
        alpha = _ident("alpha")
        calls = [
            lambda: n.write(T3, b"evil", alpha),
            lambda: n.svc.truncate(TruncateReq(chain_id=1, chain_version=1, chunk=ChunkId(inode=T3), length=0,
                                               chunk_size=CHUNK_SIZE), _ctx(alpha)),
            lambda: n.svc.remove_chunks(RemoveChunksReq(chain_id=1, chain_version=1, inode=T2,
                                                        more_inodes=[T3]), _ctx(alpha)),
            lambda: n.svc.query_chunks(QueryChunksReq(target_id=TID, inode=T3), _ctx(alpha)),
            lambda: n.svc.report_corrupt(ReportCorruptReq(target_id=TID, chunk=ChunkId(inode=T3)), _ctx(alpha)),
        ]
        for call in calls:
            with pytest.raises(StatusError) as ei:
                await call()
            _refused(ei)
        # a whole-target listing (inode 0) is for services and admins
        with pytest.raises(StatusError) as ei:
            await n.svc.query_chunks(QueryChunksReq(target_id=TID), _ctx(alpha))
        assert ei.value.status is Status.EACCES
        assert await n.read(T3, SERVICE) == b"beta's"
        # its own inodes: the tenant check passes (the grant check comes next; off here: no key)
        await n.write(T2, b"alpha's", alpha)
        listed = await n.svc.query_chunks(QueryChunksReq(target_id=TID, inode=T2), _ctx(alpha))
        assert [m.chunk.inode for m in listed.chunks if m.chunk] == [T2]
        assert (await n.svc.remove_chunks(RemoveChunksReq(chain_id=1, chain_version=1, inode=T2),
                                          _ctx(alpha))).removed == 1

    _run(body)


def test_an_unknown_tenant_is_refused_and_asked_again_later() -> None:
    async def body(n: Node) -> None:
        await n.write(T2, b"x")
        now_s = [0.0]
        n.svc.tenant_check = TenantCheck(n._resolve, retry_s=1.0, monotonic=lambda: now_s[0])
        ghost = _ident("ghost")
        for _ in range(3):
            with pytest.raises(StatusError) as ei:
                await n.read(T2, ghost)
            _refused(ei)
        assert n.asked == ["ghost"]  # negative answers are kept for retry_s
        TENANTS["ghost"] = 2  # created meanwhile (as if meta had made it)
        try:
            with pytest.raises(StatusError):
                await n.read(T2, ghost)  # not asked again within retry_s
            assert n.asked == ["ghost"]
            now_s[0] += 1.5
            assert await n.read(T2, ghost) == b"x"
            assert n.asked == ["ghost", "ghost"]
        finally:
            del TENANTS["ghost"]

    _run(body)


def test_meta_unreachable_refuses_for_now() -> None:
    async def failing(name: str) -> int | None:
        raise ConnectionError("no meta server in routing")

    async def body(n: Node) -> None:
        await n.write(T2, b"x")
        n.svc.tenant_check = TenantCheck(failing)
        with pytest.raises(StatusError) as ei:
            await n.read(T2, _ident("alpha"))
        _refused(ei)

    _run(body)


def test_forwarded_and_resync_updates_are_for_chain_peers_only() -> None:
    """A client token (even an admin's) may not send what only a chain peer sends: a forwarded
    write/truncate/removal, a resync copy, a rollback (it would skip the head's ordering and
    give one version two contents)."""
    async def body(n: Node) -> None:
        data = b"x" * 8
        crc = crc32c.crc32c(data)
        reqs = [
            ("write", dict(forwarded=True, update_ver=5)),
            ("write", dict(sync=True, from_target=TID)),
            ("write", dict(full_replace=True, update_ver=3)),
            ("truncate", dict(forwarded=True, update_ver=5)),
            ("remove", dict(forwarded=True)),
            ("remove", dict(sync=True, from_target=TID)),
        ]
        for who in (_ident(""), _ident("", USER | Right.ADMIN)):
            for kind, extra in reqs:
                with pytest.raises(StatusError) as ei:
                    if kind == "write":
                        await n.svc.write(WriteReq(chain_id=1, chain_version=1, chunk=ChunkId(inode=SHARED), length=8,
                                                   chunk_size=CHUNK_SIZE, data_crc=crc, **extra), _ctx(who, data))
                    elif kind == "truncate":
                        await n.svc.truncate(TruncateReq(chain_id=1, chain_version=1, chunk=ChunkId(inode=SHARED),
                                                         length=0, chunk_size=CHUNK_SIZE, **extra), _ctx(who))
                    else:
                        await n.svc.remove_chunks(RemoveChunksReq(chain_id=1, chain_version=1, inode=SHARED, **extra),
                                                  _ctx(who))
                assert ei.value.status is Status.EPERM and "chain peers only" in str(ei.value), (who, kind, extra)
            # a repair read of an exact version (the scrubber's: a version the tail may never
            # have committed, from a member in any state)
            with pytest.raises(StatusError) as ei:
                await n.svc.read(ReadReq(chain_id=1, chain_version=1, chunk=ChunkId(inode=SHARED), length=8,
                                         target_id=TID, exact_ver=1), _ctx(who))
            assert ei.value.status is Status.EPERM and "chain peers only" in str(ei.value), who
        # a plain client write still works (the tenant check passes; no key: no grant check)
        await n.write(SHARED, data, _ident(""))
        assert await n.read(SHARED, SERVICE) == data

    _run(body)
