"""Extended attributes in meta (``loomfs.meta.ops.xattrs``): Linux's user.* rules, limits and
errnos, permissions for the caller, over both engines; and the RPC calls on the simulated
network (status codes reach the client as the OSErrors the syscalls raise)."""

from __future__ import annotations

import asyncio
import errno
import os
import random
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_meta_namespace import FakeRouting

from loomfs.common.clock import ManualClock
from loomfs.common.identity import Identity
from loomfs.errors import LoomError, StatusError, from_status
from loomfs.meta.caller import acting_as
from loomfs.meta.ops.namespace import Namespace
from loomfs.meta.ops.xattrs import XATTR_CREATE, XATTR_LIST_MAX_BYTES, XATTR_REPLACE
from loomfs.meta.store.base import MetaStore
from loomfs.meta.store.postgres import PostgresStore
from loomfs.meta.xattr_service import XattrService
from loomfs.net.rpc import RpcClient, RpcServer
from loomfs.net.sim import LinkFaults, SimNetwork
from loomfs.net.transport import Address
from loomfs.wire import meta_xattr as wx
from loomfs.wire.types import FileType

USER = Identity(uid=1000, gid=1000)
OTHER = Identity(uid=2000, gid=2000)

BACKENDS: dict[str, Callable[[pytest.FixtureRequest, Path], str]] = {
    "sqlite": lambda request, tmp: f"sqlite:///{tmp / 'meta.db'}",
    "postgresql": lambda request, tmp: str(request.getfixturevalue("pg_url")),
}


@pytest.fixture(params=sorted(BACKENDS))
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield BACKENDS[request.param](request, tmp_path)


def with_ns(url: str, body: Callable[[Namespace, ManualClock], Awaitable[None]]) -> None:
    async def go() -> None:
        store = MetaStore.open(url)
        clock = ManualClock()
        ns = Namespace(store, routing=FakeRouting(), clock=clock, rng=random.Random(1))
        try:
            await ns.init()
            await body(ns, clock)
        finally:
            if isinstance(store, PostgresStore):
                await store.release()
            await store.close()

    asyncio.run(go())


async def put(ns: Namespace, path: str, data: bytes = b"x") -> None:
    await ns.open(path, os.O_CREAT | os.O_WRONLY | os.O_EXCL, data=data)


async def fails(code: int, aw: Awaitable[object]) -> None:
    with pytest.raises(StatusError) as info:
        await aw
    assert info.value.errno == code, info.value


def test_set_get_list_remove_with_flags(store_url: str) -> None:
    async def body(ns: Namespace, clock: ManualClock) -> None:
        await put(ns, "/f")
        before = await ns.stat("/f")
        clock.advance(1)
        after = await ns.setxattr("/f", b"user.a", b"1")
        assert after.ctime_ns > before.ctime_ns and after.mtime_ns == before.mtime_ns
        assert (await ns.stat("/f")).ctime_ns == after.ctime_ns
        await ns.setxattr("/f", b"user.b", b"")
        await ns.setxattr("/f", b"user.\xff", bytes(64 << 10))  # not UTF-8; the largest value
        assert await ns.getxattr("/f", b"user.a") == b"1"
        assert await ns.getxattr("/f", b"user.b") == b""
        assert await ns.listxattr("/f") == [b"user.a", b"user.b", b"user.\xff"]
        await ns.setxattr("/f", b"user.a", b"2")  # no flags: replace
        await fails(errno.EEXIST, ns.setxattr("/f", b"user.a", b"3", flags=XATTR_CREATE))
        await fails(errno.ENODATA, ns.setxattr("/f", b"user.c", b"3", flags=XATTR_REPLACE))
        await ns.setxattr("/f", b"user.a", b"4", flags=XATTR_REPLACE)
        await ns.setxattr("/f", b"user.c", b"5", flags=XATTR_CREATE)
        assert await ns.getxattr("/f", b"user.a") == b"4"
        await fails(errno.EINVAL, ns.setxattr("/f", b"user.a", b"3", flags=4))
        await ns.removexattr("/f", b"user.a")
        await fails(errno.ENODATA, ns.removexattr("/f", b"user.a"))
        await fails(errno.ENODATA, ns.getxattr("/f", b"user.a"))
        assert await ns.listxattr("/f") == [b"user.b", b"user.c", b"user.\xff"]
        await fails(errno.ENOENT, ns.getxattr("/nope", b"user.a"))
        await fails(errno.ENOENT, ns.setxattr("/nope", b"user.a", b""))

    with_ns(store_url, body)


def test_names_values_and_namespaces_as_linux() -> None:
    async def body(ns: Namespace, clock: ManualClock) -> None:
        await put(ns, "/f")
        await fails(errno.ERANGE, ns.setxattr("/f", b"", b"v"))
        await fails(errno.ERANGE, ns.setxattr("/f", b"user." + b"n" * 251, b"v"))
        await ns.setxattr("/f", b"user." + b"n" * 250, b"v")  # 255 bytes: fine
        await fails(errno.ERANGE, ns.getxattr("/f", b"u" * 256))
        await fails(errno.E2BIG, ns.setxattr("/f", b"user.big", bytes((64 << 10) + 1)))
        for name in (b"trusted.x", b"security.selinux", b"system.posix_acl_access", b"nonamespace"):
            await fails(errno.ENOTSUP, ns.setxattr("/f", name, b"v"))
            await fails(errno.ENOTSUP, ns.getxattr("/f", name))
        await fails(errno.EINVAL, ns.setxattr("/f", b"user.", b"v"))
        await fails(errno.EINVAL, ns.setxattr("/f", b"user.a\x00b", b"v"))

    with_ns("sqlite://:memory:", body)


def test_listing_and_inode_totals_are_bounded() -> None:
    async def body(ns: Namespace, clock: ManualClock) -> None:
        await put(ns, "/f")
        names = [b"user.%0250d" % i for i in range(XATTR_LIST_MAX_BYTES // 256)]  # 256 bytes each
        for n in names:
            await ns.setxattr("/f", n, b"")
        await fails(errno.ENOSPC, ns.setxattr("/f", b"user.one-more", b""))
        await ns.setxattr("/f", names[0], b"v")  # replacing an existing name still works
        await put(ns, "/g")
        for i in range(15):
            await ns.setxattr("/g", b"user.%d" % i, bytes(64 << 10))
        await fails(errno.ENOSPC, ns.setxattr("/g", b"user.16", bytes(64 << 10)))

    with_ns("sqlite://:memory:", body)


def test_file_types_links_and_removal(store_url: str) -> None:
    async def body(ns: Namespace, clock: ManualClock) -> None:
        await ns.mkdir("/d")
        await put(ns, "/d/f")
        await ns.setxattr("/d", b"user.dir", b"D")
        await ns.setxattr("/d/f", b"user.k", b"F")
        await ns.symlink("/d/f", "/l")
        assert await ns.getxattr("/l", b"user.k") == b"F"  # followed
        await fails(errno.ENODATA, ns.getxattr("/l", b"user.k", follow_symlinks=False))
        await fails(errno.EPERM, ns.setxattr("/l", b"user.k", b"x", follow_symlinks=False))
        assert await ns.listxattr("/l", follow_symlinks=False) == []
        await ns.mknod("/p", type=FileType.FIFO)
        await fails(errno.EPERM, ns.setxattr("/p", b"user.k", b"x"))
        await fails(errno.EPERM, ns.removexattr("/p", b"user.k"))
        await ns.link("/d/f", "/h")  # one inode, one set of attributes
        assert await ns.getxattr("/h", b"user.k") == b"F"
        await ns.rename("/d/f", "/moved")
        assert await ns.getxattr("/moved", b"user.k") == b"F"
        ino = (await ns.stat("/h")).inode
        await ns.unlink("/moved")
        assert await ns.listxattr("/h") == [b"user.k"]  # the inode lives on through /h
        await ns.unlink("/h")
        async with ns.store.read() as txn:
            assert await txn.list_xattrs(ino) == []  # gone with the inode
        assert await ns.getxattr("/d", b"user.dir") == b"D"

    with_ns(store_url, body)


def test_permissions_of_the_caller() -> None:
    async def body(ns: Namespace, clock: ManualClock) -> None:
        await put(ns, "/ro")  # root's, 0644
        await ns.setxattr("/ro", b"user.k", b"v")
        await put(ns, "/secret")
        await ns.setxattr("/secret", b"user.k", b"v")
        await ns.setattr("/secret", mode=0o600)
        await put(ns, "/mine")
        await ns.setattr("/mine", uid=USER.uid, gid=USER.gid, mode=0o644)
        await ns.mkdir("/tmp", mode=0o1777)
        await ns.mkdir("/shared", mode=0o777)
        with acting_as(USER):
            assert await ns.getxattr("/ro", b"user.k") == b"v"
            await fails(errno.EACCES, ns.setxattr("/ro", b"user.k", b"w"))
            await fails(errno.EACCES, ns.removexattr("/ro", b"user.k"))
            await fails(errno.EACCES, ns.getxattr("/secret", b"user.k"))
            assert await ns.listxattr("/secret") == [b"user.k"]  # listing needs no read permission
            await ns.setxattr("/mine", b"user.k", b"mine")
            await fails(errno.EPERM, ns.setxattr("/tmp", b"user.k", b"v"))  # sticky, not the owner
            await ns.setxattr("/shared", b"user.k", b"v")  # not sticky: write permission is enough
        await ns.setattr("/mine", mode=0o444)
        with acting_as(USER):
            await fails(errno.EACCES, ns.setxattr("/mine", b"user.k", b"x"))  # the owner needs w too
        with acting_as(OTHER):
            await fails(errno.EACCES, ns.setxattr("/mine", b"user.k", b"x"))
            assert await ns.getxattr("/mine", b"user.k") == b"mine"
        await ns.setxattr("/secret", b"user.k", b"root")  # root passes

    with_ns("sqlite://:memory:", body)


def test_xattr_calls_over_rpc() -> None:
    async def go() -> None:
        net = SimNetwork(seed=3, faults=LinkFaults(latency_s=0.0, jitter_s=0.0))
        store = MetaStore.open("sqlite://:memory:")
        ns = Namespace(store, routing=FakeRouting(), clock=ManualClock(), rng=random.Random(1))
        await ns.init()
        await put(ns, "/f")
        server = RpcServer("meta", net.transport("10.0.0.1"))
        server.add_service(XattrService(ns))
        addr = await server.start(Address("10.0.0.1", 8100))
        c = RpcClient(net.transport("10.0.0.2"), call_timeout_s=2.0)
        try:
            rsp = (await c.call(addr, wx.SETXATTR, wx.XattrSetReq(path="/f", name=b"user.k", value=b"\x00v"))).body
            assert rsp.attr.inode == (await ns.stat("/f")).inode
            got = (await c.call(addr, wx.GETXATTR, wx.XattrNameReq(path="/f", name=b"user.k"))).body
            assert got.value == b"\x00v"
            assert (await c.call(addr, wx.LISTXATTR, wx.XattrListReq(path="/f"))).body.names == [b"user.k"]
            for m, req, code in [
                (wx.SETXATTR, wx.XattrSetReq(path="/f", name=b"user.k", value=b"", flags=XATTR_CREATE), errno.EEXIST),
                (wx.GETXATTR, wx.XattrNameReq(path="/f", name=b"user.none"), errno.ENODATA),
                (wx.GETXATTR, wx.XattrNameReq(path="/f", name=b"x" * 300), errno.ERANGE),
                (wx.SETXATTR, wx.XattrSetReq(path="/f", name=b"user.big", value=bytes(70000)), errno.E2BIG),
                (wx.SETXATTR, wx.XattrSetReq(path="/f", name=b"trusted.k", value=b""), errno.ENOTSUP),
                (wx.REMOVEXATTR, wx.XattrNameReq(path="/nope", name=b"user.k"), errno.ENOENT),
            ]:
                with pytest.raises(LoomError) as info:
                    await c.call(addr, m, req)
                assert isinstance(info.value, OSError) and info.value.errno == code, (m.name, info.value)
                assert type(info.value) is type(from_status(code))
            await c.call(addr, wx.REMOVEXATTR, wx.XattrNameReq(path="/f", name=b"user.k"))
            assert (await c.call(addr, wx.LISTXATTR, wx.XattrListReq(path="/f"))).body.names == []
        finally:
            await c.close()
            await server.close()
            await store.close()

    asyncio.run(go())


def test_service_acts_for_the_connection_and_squashes_root() -> None:
    """The RPC adapter (no sockets): each call acts for the connection's identity; with root
    squash a token's uid 0 without ADMIN is nobody, an ADMIN one is not squashed."""
    from loomfs.common.identity import Right
    from loomfs.net.rpc import CallContext

    def ctx(who: Identity) -> CallContext:
        return CallContext(memoryview(b""), 1, "test", None, 0, who)

    token_root = Identity(uid=0, gid=0, rights=Right.user(), token_id="t-root")
    admin = Identity(uid=0, gid=0, rights=Right.all(), token_id="admin")

    async def body(ns: Namespace, clock: ManualClock) -> None:
        await put(ns, "/f")
        await ns.setattr("/f", mode=0o600)
        plain, squashing = XattrService(ns), XattrService(ns, root_squash=True)
        set_req = wx.XattrSetReq(path="/f", name=b"user.k", value=b"v")

        async def call(coro: Coroutine[Any, Any, object]) -> object:
            return await asyncio.create_task(coro)  # its own task, as each request has

        await call(plain.setxattr(set_req, ctx(token_root)))
        with pytest.raises(OSError) as info:
            await call(squashing.getxattr(wx.XattrNameReq(path="/f", name=b"user.k"), ctx(token_root)))
        assert info.value.errno == errno.EACCES
        with pytest.raises(OSError) as info:
            await call(plain.setxattr(set_req, ctx(USER)))
        assert info.value.errno == errno.EACCES
        got = await call(squashing.getxattr(wx.XattrNameReq(path="/f", name=b"user.k"), ctx(admin)))
        assert got == wx.XattrValueRsp(value=b"v")
        assert "root_squash=True" in repr(squashing)

    with_ns("sqlite://:memory:", body)


def test_by_inode_also_for_a_file_whose_last_name_went(store_url: str) -> None:
    """An inode names the file whatever its names: an open file unlinked (meta's orphan) keeps
    its attributes; the path then only labels errors; the inode's own checks still apply."""

    async def body(ns: Namespace, clock: ManualClock) -> None:
        o = await ns.open("/f", os.O_CREAT | os.O_RDWR, client_id=7, session_id=(1 << 62) | 5, chunked=True)
        ino = o.attr.inode
        await ns.setxattr("/f", b"user.a", b"1")
        await ns.unlink("/f")
        await fails(errno.ENOENT, ns.getxattr("/f", b"user.a"))  # by path: no name left
        assert await ns.getxattr("", b"user.a", inode=ino) == b"1"
        await ns.setxattr("/whatever", b"user.b", b"2", flags=XATTR_CREATE, inode=ino)
        await fails(errno.EEXIST, ns.setxattr("", b"user.b", b"3", flags=XATTR_CREATE, inode=ino))
        assert await ns.listxattr("", inode=ino) == [b"user.a", b"user.b"]
        await ns.removexattr("", b"user.a", inode=ino)
        assert await ns.listxattr("", inode=ino) == [b"user.b"]
        with acting_as(OTHER):  # the inode's own permission checks (mode 0644, owner root)
            await fails(errno.EACCES, ns.setxattr("", b"user.c", b"", inode=ino))
        await fails(errno.ENOENT, ns.getxattr("", b"user.a", inode=ino + 1000))

    with_ns(store_url, body)
