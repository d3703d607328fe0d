"""Batch calls (STAT_MANY, READ_MANY, PUT_MANY, UNLINK_MANY): the ops over a Namespace, the
service over the simulated network (bounds, bad input), and the client's batch module on top
(no sockets, no sleeps)."""

from __future__ import annotations

import asyncio
import errno
import os
import random
from collections.abc import Awaitable, Callable
from typing import Any

import crc32c
import msgpack
import pytest
from test_client_support import FakeStorage
from test_meta_namespace import CREAT, Env, FakeRouting

from loomfs.client import batch as cbatch
from loomfs.client.core import AsyncClient
from loomfs.client.meta_client import MetaClient
from loomfs.common.clock import ManualClock
from loomfs.common.routing import Routing
from loomfs.errors import ChecksumError, InvalidArgument, LoomError, RemoteError
from loomfs.meta.batch_service import BatchService
from loomfs.meta.ops.batch import READ_TXN_ITEMS, BatchOps, Content, Failed, Put, PutItem
from loomfs.meta.ops.namespace import Namespace
from loomfs.meta.service import MetaService
from loomfs.meta.store.base import InlineData
from loomfs.meta.store.sqlite import SqliteStore
from loomfs.net.rpc import RpcClient, RpcServer
from loomfs.net.sim import LinkFaults, SimNetwork
from loomfs.net.transport import Address
from loomfs.wire import frame as fr
from loomfs.wire import meta_batch as wb
from loomfs.wire.message import Message, Method, many, message
from loomfs.wire.status import Status
from loomfs.wire.types import SERVICE_META, Attr, FileType, Layout, NodeInfo, NodeKind, RoutingInfo

LIMIT = 64 << 10


def put_item(path: str, data: bytes) -> PutItem:
    return PutItem(path, data, crc32c.crc32c(data))


def ok(env: Env, paths: list[str], *, follow: bool = True) -> list[Any]:
    """What the single calls answer for each path: the attributes, or the errno."""
    out: list[Any] = []
    for p in paths:
        try:
            out.append(env.run(env.ns.stat(p, follow_symlinks=follow)))
        except OSError as exc:
            out.append(exc.errno)
    return out


def as_single(results: list[Any]) -> list[Any]:
    return [r.status if isinstance(r, Failed) else r for r in results]


def tree(env: Env) -> None:
    """Directories, files (inline and in chunks), symlinks of every kind."""
    ns = env.ns
    env.run(ns.mkdir("/a/b/c", parents=True))
    env.run(ns.mkdir("/d"))
    env.run(ns.open("/a/f", CREAT | os.O_TRUNC, data=b"inline f"))
    env.create("/a/b/big", CREAT, chunked=True)
    env.run(ns.open("/d/g", CREAT | os.O_TRUNC, data=b"g" * 100))
    env.run(ns.symlink("/a/f", "/l_file"))
    env.run(ns.symlink("../a/b", "/d/l_rel"))
    env.run(ns.symlink("/a/b/", "/l_dir_slash"))
    env.run(ns.symlink("/nowhere", "/l_dangling"))
    env.run(ns.symlink("/l_loop2", "/l_loop1"))
    env.run(ns.symlink("/l_loop1", "/l_loop2"))


def random_paths(rng: random.Random, n: int) -> list[str]:
    names = ["a", "b", "c", "d", "f", "g", "big", "l_file", "l_rel", "l_dir_slash", "l_dangling", "l_loop1",
             "missing", "."]
    out = []
    for _ in range(n):
        depth = rng.randint(0, 4)
        out.append("/" + "/".join(rng.choice(names) for _ in range(depth)))
    return out + ["", "relative", "/a//f", "/a/\x00", "/" + "x" * 300, "/d/l_rel/c", "/a/f/", "/l_dir_slash"]


# --- ops over a Namespace -------------------------------------------------------------------


@pytest.mark.parametrize("follow", [True, False])
def test_stat_many_answers_what_stat_answers(follow: bool) -> None:
    env = Env(inline_max_bytes=LIMIT)
    tree(env)
    paths = random_paths(random.Random(5), 600)  # more than one transaction's group
    assert len(paths) > READ_TXN_ITEMS
    got = env.run(BatchOps(env.ns).stat_many(paths, follow_symlinks=follow))
    assert as_single(got) == ok(env, paths, follow=follow)
    env.close()


def test_read_many_answers_what_read_answers() -> None:
    env = Env(inline_max_bytes=LIMIT)
    tree(env)
    paths = ["/a/f", "/a/b/big", "/d/g", "/l_file", "/a", "/", "/missing", "/a/f/x", "/l_loop1", "/l_dangling",
             "/d/l_rel/c", "rel"]
    got = env.run(BatchOps(env.ns).read_many(paths))
    codes = [r.status if isinstance(r, Failed) else r for r in got]
    assert codes[4:] == [errno.EISDIR, errno.EISDIR, errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.ENOENT,
                         errno.EISDIR, errno.EINVAL]
    for p, r in zip(paths[:4], got[:4], strict=True):
        assert isinstance(r, Content)
        attr, data = env.run(env.ns.read(p))
        assert (r.attr, r.data) == (attr, data)
    f, big = got[0], got[1]
    assert isinstance(f, Content) and isinstance(big, Content)
    assert f.data == b"inline f" and f.attr.inline
    assert big.data is None and not big.attr.inline and big.attr.layout is not None and big.attr.layout.chains
    # a symlink read without following is not a file
    nofollow = env.run(BatchOps(env.ns).read_many(["/l_file"], follow_symlinks=False))
    assert isinstance(nofollow[0], Failed) and nofollow[0].status == errno.ELOOP
    env.close()


def test_read_many_of_files_in_chunks_when_inline_is_off() -> None:
    env = Env()  # inline_max_bytes 0: every file in chunks
    env.create("/x")
    (r,) = env.run(BatchOps(env.ns).read_many(["/x"]))
    assert isinstance(r, Content) and r.data is None and not r.attr.inline
    env.close()


def test_rotten_inline_data_fails_its_item_only() -> None:
    env = Env(inline_max_bytes=LIMIT)
    for name in ("p", "q"):
        env.run(env.ns.open(f"/{name}", CREAT | os.O_TRUNC, data=name.encode() * 10))
    ino = env.run(env.ns.stat("/p")).inode

    async def rot() -> None:
        async with env.store.write() as txn:
            row = await txn.get_inline(ino)
            assert row is not None
            await txn.put_inline(ino, InlineData(b"X" + row.data[1:], row.crc, row.version))

    env.run(rot())
    p, q = env.run(BatchOps(env.ns).read_many(["/p", "/q"]))
    assert isinstance(p, Failed) and p.status == errno.EIO and "checksum" in p.message
    assert isinstance(q, Content) and q.data == b"q" * 10
    env.close()


def test_replies_answer_a_prefix_within_their_bounds() -> None:
    env = Env(inline_max_bytes=LIMIT)
    env.run(env.ns.mkdir("/d"))
    paths = [f"/d/f{i}" for i in range(40)]
    for p in paths:
        env.run(env.ns.open(p, CREAT | os.O_TRUNC, data=b"z" * 1000))
    ops = BatchOps(env.ns)
    got = env.run(ops.read_many(paths, data_bytes_max=5500))
    assert len(got) == 5 and all(isinstance(r, Content) and r.data == b"z" * 1000 for r in got)
    assert len(env.run(ops.read_many(paths, data_bytes_max=1))) == 1  # always at least one
    assert len(env.run(ops.read_many(paths + ["/nope"] * 10, body_bytes_max=1))) == 1
    missing = env.run(ops.read_many(["/nope"] * 40, body_bytes_max=10 * wb.ITEM_ERROR_BYTES_MAX))
    assert 5 <= len(missing) <= 10
    stats = env.run(ops.stat_many(paths, body_bytes_max=3000))
    assert 1 <= len(stats) < len(paths) and all(isinstance(a, Attr) for a in stats)
    # a batch that stopped early left the store free
    env.run(env.ns.mkdir("/after"))
    env.close()


def test_put_many_stores_small_files_inline_in_order() -> None:
    env = Env(inline_max_bytes=LIMIT)
    ns = env.ns
    env.run(ns.mkdir("/d"))
    env.run(ns.mkdir("/small"))
    env.run(ns.set_layout("/small", Layout(chunk_size=1 << 20, stripe=4, table_id=1, inline_max_bytes=100)))
    env.create("/d/chunked", CREAT, chunked=True)
    env.run(ns.open("/d/old", CREAT | os.O_TRUNC, data=b"old content"))
    env.run(ns.open("/small/keep", CREAT | os.O_TRUNC, data=b"keep"))
    items = [
        put_item("/d/new", b"new"),
        put_item("/d/old", b"replaced"),
        put_item("/d/chunked", b"now inline"),
        put_item("/d/empty", b""),
        put_item("/small/fits", b"x" * 100),
        put_item("/small/too_big", b"x" * 101),
        put_item("/small/keep", b"y" * 101),  # too big: the old content stays
        put_item("/d", b"dir"),
        put_item("/nope/x", b"1"),
        put_item("/d/old/x", b"1"),
        PutItem("/d/crc", b"abc", 1),
        put_item("rel", b"1"),
        put_item("/d/new", b"new again"),  # in order: the last one wins
    ]
    got = env.run(BatchOps(ns).put_many(items, mode=0o600))
    assert [r if isinstance(r, Put) else r.status for r in got] == [
        Put.DONE, Put.DONE, Put.DONE, Put.DONE, Put.DONE, Put.FALLBACK, Put.FALLBACK, errno.EISDIR,
        errno.ENOENT, errno.ENOTDIR, Status.CHECKSUM_MISMATCH, errno.EINVAL, Put.DONE,
    ]
    for path, want in [("/d/new", b"new again"), ("/d/old", b"replaced"), ("/d/chunked", b"now inline"),
                       ("/d/empty", b""), ("/small/fits", b"x" * 100), ("/small/keep", b"keep")]:
        attr, data = env.run(ns.read(path))
        assert attr.inline and data == want, path
    assert env.run(ns.stat("/d/new")).mode == 0o600
    assert env.err(ns.stat("/small/too_big")) == errno.ENOENT  # a fallback is left untouched
    assert env.err(ns.stat("/d/crc")) == errno.ENOENT
    inodes = [env.run(ns.stat(p)).inode for p in ("/d/new", "/d/old", "/d/chunked", "/small/keep")]

    async def sessions() -> int:
        async with env.store.read() as txn:
            return sum([await txn.session_count(i) for i in inodes])

    assert env.run(sessions()) == 0  # puts open no write session

    env.close()


def test_put_many_with_inline_off_leaves_every_item_to_the_client() -> None:
    env = Env()
    got = env.run(BatchOps(env.ns).put_many([put_item("/a", b"1"), put_item("/b", b"")]))
    assert got == [Put.FALLBACK, Put.FALLBACK]
    assert env.run(env.ns.statfs()).files == 0
    env.close()


def test_put_whose_open_falls_back_closes_its_session() -> None:
    """The limit changed between the look and the open: the open went to chunks."""
    env = Env()
    ops = BatchOps(env.ns)

    async def no_plan(items: list[PutItem]) -> list[None]:
        return [None] * len(items)

    ops._put_plan = no_plan  # type: ignore[assignment,method-assign]
    assert env.run(ops.put_many([put_item("/a", b"abc")])) == [Put.FALLBACK]
    attr = env.run(env.ns.stat("/a"))
    assert attr.size == 0 and not attr.inline

    async def has_session() -> bool:
        async with env.store.read() as txn:
            return await txn.has_session(attr.inode)

    assert not env.run(has_session())
    env.close()


def test_unlink_many_in_order() -> None:
    env = Env(inline_max_bytes=LIMIT)
    tree(env)
    big = env.run(env.ns.stat("/a/b/big"))
    files_before = env.run(env.ns.statfs()).files
    got = env.run(BatchOps(env.ns).unlink_many(
        ["/a/f", "/a/f", "/l_file", "/a/b", "/missing", "/a/b/big", "/d/g", "/l_dir_slash", "rel"]))
    codes = [r.status if isinstance(r, Failed) else r for r in got]
    assert codes[0][1] is False  # an inline file: storage holds nothing of it
    assert codes[1:] == [errno.ENOENT, codes[2], errno.EISDIR, errno.ENOENT, (big.inode, True), codes[6],
                         codes[7], errno.EINVAL]
    assert env.err(env.ns.stat("/l_file", follow_symlinks=False)) == errno.ENOENT
    assert env.run(env.ns.stat("/a/b")).type == FileType.DIRECTORY  # the symlink went, not its target
    assert env.run(env.ns.statfs()).files == files_before - 3
    env.close()


# --- the service over the simulated network -------------------------------------------------


class MetaRouting:
    """Routing with one meta node (for MetaClient) and FakeRouting's chains (for files)."""

    def __init__(self, addr: Address) -> None:
        base = FakeRouting().routing.info
        node = NodeInfo(node_id=1, kind=NodeKind.META, host=addr.host, port=addr.port)
        self.routing = Routing(RoutingInfo(version=1, nodes=[node], chains=base.chains, tables=base.tables))

    async def get(self) -> Routing:
        return self.routing

    async def refresh(self, min_version: int = 0) -> Routing:
        return self.routing


class Cluster:
    """A meta server (both services) on the simulated network, its namespace, and a client."""

    def __init__(self, ns: Namespace, server: RpcServer, addr: Address, rpc: RpcClient, client: AsyncClient,
                 storage: FakeStorage) -> None:
        self.ns, self.server, self.addr, self.rpc, self.client, self.storage = ns, server, addr, rpc, client, storage

    async def call(self, m: Method, req: Message, payload: bytes | None = None) -> Any:
        return await self.rpc.call(self.addr, m, req, payload=payload)

    async def put(self, path: str, data: bytes) -> None:
        o = await self.ns.open(path, CREAT | os.O_TRUNC, data=data)
        assert o.session_id == 0


def run_cluster(body: Callable[[Cluster], Awaitable[None]], *, inline_max_bytes: int = LIMIT) -> None:
    async def main() -> None:
        net = SimNetwork(seed=1, faults=LinkFaults(latency_s=0.0, jitter_s=0.0))
        storage = FakeStorage()
        ns = Namespace(SqliteStore(":memory:"), routing=FakeRouting(), clock=ManualClock(), rng=random.Random(1),
                       default_layout=Layout(chunk_size=1 << 20, stripe=4, table_id=1, inline_max_bytes=inline_max_bytes),
                       chunk_writer=storage)
        await ns.init()
        server = RpcServer("meta", net.transport("10.0.0.1"))
        server.add_service(MetaService(ns))
        server.add_service(BatchService(ns))
        addr = await server.start(Address("10.0.0.1", 8100))
        rpc = RpcClient(net.transport("10.0.0.2"), call_timeout_s=10.0)
        client = AsyncClient(MetaClient(rpc, MetaRouting(addr)), storage, rpc=rpc)  # type: ignore[arg-type]
        try:
            await body(Cluster(ns, server, addr, rpc, client, storage))
        finally:
            await client.close()
            await server.close()

    asyncio.run(main())


def test_every_batch_method_over_rpc() -> None:
    async def body(c: Cluster) -> None:
        await c.ns.mkdir("/d")
        await c.put("/d/a", b"alpha")
        o = await c.ns.open("/d/big", CREAT, chunked=True)
        await c.ns.close(o.attr.inode, o.session_id, 10)
        st: wb.StatManyRsp = (await c.call(wb.STAT_MANY, wb.PathsReq(paths=["/d/a", "/nope", "/d"]))).body
        assert st.count == 3 and st.attrs[0].size == 5 and st.attrs[1] is None and st.attrs[2].type == FileType.DIRECTORY
        assert [(e.index, e.status) for e in st.errors] == [(1, errno.ENOENT)]
        rsp = await c.call(wb.READ_MANY, wb.PathsReq(paths=["/d/a", "/d/big", "/d", "/d/a"]))
        rd: wb.ReadManyRsp = rsp.body
        assert rd.count == 4 and rd.lengths == [5, -1, -1, 5] and bytes(rsp.payload) == b"alphaalpha"
        assert rd.crcs == [crc32c.crc32c(b"alpha"), 0, 0, crc32c.crc32c(b"alpha")]
        assert [(x.index, x.attr.size) for x in rd.chunked] == [(1, 10)]
        assert [(e.index, e.status) for e in rd.errors] == [(2, errno.EISDIR)]
        datas = [b"one", b"", b"three"]
        req = wb.PutManyReq(paths=["/d/1", "/d/2", "/x/3"], lengths=[len(d) for d in datas],
                            crcs=[crc32c.crc32c(d) for d in datas])
        pm: wb.PutManyRsp = (await c.call(wb.PUT_MANY, req, b"".join(datas))).body
        assert pm.count == 3 and pm.fallback == [] and [(e.index, e.status) for e in pm.errors] == [(2, errno.ENOENT)]
        assert (await c.ns.read("/d/1"))[1] == b"one"
        um: wb.UnlinkManyRsp = (await c.call(wb.UNLINK_MANY, wb.PathsReq(paths=["/d/1", "/d/1", "/d"]))).body
        assert um.count == 3 and [(e.index, e.status) for e in um.errors] == [(1, errno.ENOENT), (2, errno.EISDIR)]
        empty: wb.StatManyRsp = (await c.call(wb.STAT_MANY, wb.PathsReq())).body
        assert empty.count == 0

    run_cluster(body)


@message
class _BadPaths(Message):
    paths: int = 5
    follow_symlinks: str = "yes"


@message
class _BadPut(Message):
    paths: list[str] = many()
    lengths: list[str] = many()


def test_bad_input_is_refused_not_crashed() -> None:
    async def body(c: Cluster) -> None:
        bad_stat = Method(SERVICE_META, wb.STAT_MANY.method, "stat_many", _BadPaths, wb.StatManyRsp)
        bad_put = Method(SERVICE_META, wb.PUT_MANY.method, "put_many", _BadPut, wb.PutManyRsp)
        with pytest.raises(RemoteError) as ei:
            await c.call(bad_stat, _BadPaths())
        assert ei.value.status is Status.BAD_REQUEST
        with pytest.raises(RemoteError) as ei:
            await c.call(bad_put, _BadPut(paths=["/a"], lengths=["1"]), b"x")
        assert ei.value.status is Status.BAD_REQUEST
        too_many = wb.PathsReq(paths=["/a"] * (wb.BATCH_ITEMS_MAX + 1))
        for m in (wb.STAT_MANY, wb.READ_MANY, wb.UNLINK_MANY):
            with pytest.raises(InvalidArgument):
                await c.call(m, too_many)

        async def put(req: wb.PutManyReq, payload: bytes | None) -> Status | None:
            try:
                await c.call(wb.PUT_MANY, req, payload)
            except LoomError as exc:
                return exc.status
            return None

        one = dict(paths=["/a"], crcs=[0])
        assert await put(wb.PutManyReq(paths=["/a"], lengths=[1, 2], crcs=[0]), b"x") is Status.BAD_REQUEST
        assert await put(wb.PutManyReq(lengths=[2], **one), b"x") is Status.BAD_REQUEST  # payload too short
        assert await put(wb.PutManyReq(lengths=[0], **one), b"x") is Status.BAD_REQUEST  # payload too long
        assert await put(wb.PutManyReq(lengths=[-1], **one), None) is Status.EINVAL
        big = wb.PUT_MANY_ITEM_BYTES_MAX + 1
        assert await put(wb.PutManyReq(lengths=[big], **one), bytes(big)) is Status.EINVAL
        n = wb.PUT_MANY_DATA_BYTES_MAX // wb.PUT_MANY_ITEM_BYTES_MAX + 1
        over = wb.PutManyReq(paths=["/a"] * n, lengths=[wb.PUT_MANY_ITEM_BYTES_MAX] * n, crcs=[0] * n)
        assert await put(over, bytes(n * wb.PUT_MANY_ITEM_BYTES_MAX)) is Status.EINVAL
        assert (await c.ns.statfs()).files == 0  # nothing was done
        # odd but well-typed paths answer per item
        st: wb.StatManyRsp = (await c.call(wb.STAT_MANY, wb.PathsReq(paths=["", "a", "/\x00", "/" + "é" * 300]))).body
        assert [e.status for e in st.errors] == [errno.ENOENT, errno.EINVAL, errno.EINVAL, errno.ENAMETOOLONG]
        assert all(len(e.message.encode()) <= wb.ITEM_MESSAGE_BYTES_MAX for e in st.errors)

    run_cluster(body)


def test_replies_stay_within_one_frame_and_the_client_asks_again() -> None:
    async def body(c: Cluster) -> None:
        await c.ns.mkdir("/d")
        n = wb.READ_MANY_DATA_BYTES_MAX // LIMIT + 20  # more inline bytes than one reply carries
        datas = [random.Random(i).randbytes(LIMIT) for i in range(n)]
        for i, d in enumerate(datas):
            await c.put(f"/d/{i}", d)
        paths = [f"/d/{i}" for i in range(n)]
        rsp = await c.call(wb.READ_MANY, wb.PathsReq(paths=paths))
        assert 0 < rsp.body.count < n and len(rsp.payload) <= wb.READ_MANY_DATA_BYTES_MAX
        assert await cbatch.read_many(c.client, paths) == datas
        # attributes of 4096 files: more than one frame header holds
        many_paths = ["/d/0"] * wb.BATCH_ITEMS_MAX
        st = await c.call(wb.STAT_MANY, wb.PathsReq(paths=many_paths))
        assert 0 < st.body.count < wb.BATCH_ITEMS_MAX
        assert len(msgpack.packb(st.body.to_wire())) <= wb.REPLY_BODY_BYTES_MAX < fr.MAX_HEADER_BYTES
        got = await cbatch.stat_many(c.client, many_paths + ["/d/1"])
        assert len(got) == wb.BATCH_ITEMS_MAX + 1 and all(isinstance(a, Attr) for a in got)
        # errors with long messages for every item still fit
        missing = ["/" + "m" * 100 + f"/{i}" for i in range(wb.BATCH_ITEMS_MAX)]  # within a request's bound
        um = await c.call(wb.UNLINK_MANY, wb.PathsReq(paths=missing))
        assert um.body.count == wb.BATCH_ITEMS_MAX
        assert len(msgpack.packb(um.body.to_wire())) <= wb.REPLY_BODY_BYTES_MAX

    run_cluster(body)


# --- the client's batch module --------------------------------------------------------------


def test_client_reads_inline_and_chunked_files_with_per_item_errors() -> None:
    async def body(c: Cluster) -> None:
        await c.ns.mkdir("/d")
        await c.put("/d/small", b"small")
        big = random.Random(3).randbytes(2_500_000)  # three 1 MiB chunks
        o = await c.ns.open("/d/big", CREAT, chunked=True)
        layout = o.attr.layout
        assert layout is not None
        for i in range(0, len(big), layout.chunk_size):
            await c.storage.write_chunk(layout, o.attr.inode, i // layout.chunk_size, 0,
                                        memoryview(big[i : i + layout.chunk_size]))
        await c.ns.close(o.attr.inode, o.session_id, len(big))
        e = await c.ns.open("/d/empty", CREAT, chunked=True)
        await c.ns.close(e.attr.inode, e.session_id)
        await c.ns.symlink("/d/small", "/link")
        paths = ["/d/small", "/d/big", "/d/empty", "/link", "//d/./small", "/d", "/nope", "/d/small/x", "", "/d/big"]
        got = await cbatch.read_many(c.client, paths)
        assert got[:5] == [b"small", big, b"", b"small", b"small"] and got[9] == big
        kinds = [(type(r).__name__, r.errno, r.filename) for r in got[5:9] if isinstance(r, OSError)]
        assert kinds == [("IsADirectory", errno.EISDIR, "/d"), ("NotFound", errno.ENOENT, "/nope"),
                         ("NotADirectory", errno.ENOTDIR, "/d/small/x"), ("NotFound", errno.ENOENT, "")]
        assert c.storage.inflight_reads_max <= cbatch.READ_CHUNKS_INFLIGHT
        st = await cbatch.stat_many(c.client, ["/link", "/nope"], follow_symlinks=False)
        assert isinstance(st[0], Attr) and st[0].type == FileType.SYMLINK
        assert isinstance(st[1], FileNotFoundError)

    run_cluster(body)


def test_client_checks_crcs_and_keeps_storage_errors_to_their_item() -> None:
    async def body(c: Cluster) -> None:
        await c.put("/a", b"aaa")
        await c.put("/b", b"bbb")
        o = await c.ns.open("/c", CREAT, chunked=True)
        await c.ns.close(o.attr.inode, o.session_id, 10)
        real_call = cbatch._call

        async def tampered(client: AsyncClient, m: Method, req: Message, **kw: Any) -> Any:
            rsp = await real_call(client, m, req, **kw)
            if m is wb.READ_MANY:
                rsp.body.crcs[0] ^= 1
            return rsp

        real_read = c.storage.read_chunk

        async def failing_read(layout: Layout, inode: int, *args: Any) -> int:
            if inode == o.attr.inode:
                raise LoomError("chain unavailable", errno=errno.EIO)
            return await real_read(layout, inode, *args)

        cbatch._call = tampered  # type: ignore[assignment]
        c.storage.read_chunk = failing_read  # type: ignore[method-assign]
        try:
            a, b, cc = await cbatch.read_many(c.client, ["/a", "/b", "/c"])
        finally:
            cbatch._call = real_call  # type: ignore[assignment]
        assert isinstance(a, ChecksumError) and a.filename == "/a"
        assert b == b"bbb"
        assert isinstance(cc, OSError) and cc.errno == errno.EIO and cc.filename == "/c"

    run_cluster(body)


def test_client_puts_small_items_in_batches_and_the_rest_through_pipe() -> None:
    async def body(c: Cluster) -> None:
        await c.ns.mkdir("/d")
        await c.ns.mkdir("/tiny")
        await c.ns.set_layout("/tiny", Layout(chunk_size=1 << 20, stripe=4, table_id=1, inline_max_bytes=10))
        rng = random.Random(9)
        items = [
            ("/d/a", b"a" * 100),
            ("/d/big", rng.randbytes(300_000)),  # past inline_put_max_bytes: straight to pipe
            ("/tiny/fits", b"0123456789"),
            ("/tiny/fallback", b"x" * 11),  # meta answers: too big for the directory
            ("/nope/x", b"1"),
            ("/d", b"dir"),
            ("/d/a", b"last wins"),
            ("bad\x00", b"1"),
        ]
        got = await cbatch.put_many(c.client, items)
        assert [type(r).__name__ if r is not None else None for r in got] == [
            None, None, None, None, "NotFound", "IsADirectory", None, "InvalidArgument"]
        assert got[4] is not None and got[4].filename == "/nope/x"
        assert await cbatch.read_many(c.client, ["/d/a", "/d/big", "/tiny/fits", "/tiny/fallback"]) == [
            b"last wins", items[1][1], b"0123456789", b"x" * 11]
        attrs = await cbatch.stat_many(c.client, ["/d/a", "/d/big", "/tiny/fits", "/tiny/fallback"])
        assert [a.inline for a in attrs if isinstance(a, Attr)] == [True, False, True, False]
        assert await cbatch.put_many(c.client, {}) == []
        with pytest.raises(TypeError):
            await cbatch.put_many(c.client, [("/d/s", "text")])  # type: ignore[list-item]
        removed = await cbatch.rm_many(c.client, ["/d/a", "/d/a", "/d", "/d/big"])
        assert [type(r).__name__ if r is not None else None for r in removed] == [
            None, "NotFound", "IsADirectory", None]

    run_cluster(body)


def test_client_splits_batches_over_the_item_bound() -> None:
    async def body(c: Cluster) -> None:
        n = wb.BATCH_ITEMS_MAX + 100
        items = {f"/f{i}": str(i).encode() for i in range(n)}
        assert await cbatch.put_many(c.client, items) == [None] * n
        assert await cbatch.read_many(c.client, list(items)) == list(items.values())
        assert await cbatch.rm_many(c.client, list(items)) == [None] * n
        assert (await c.ns.statfs()).files == 0

    run_cluster(body)
