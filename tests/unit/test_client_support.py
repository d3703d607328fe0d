"""In-memory fakes of the meta and storage clients for client unit tests (no sockets)."""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace

import pytest

from loomfs.client.core import AsyncClient
from loomfs.client.meta_client import MetaClient
from loomfs.client.storage_client import INDEX_END_ALL, zero_fill
from loomfs.config import ClientConfig
from loomfs.errors import AlreadyExists, IsADirectory, LoomError, NoSpace, NotADirectory, NotFound
from loomfs.net.buffers import BufferPool
from loomfs.wire import meta as wm
from loomfs.wire.types import Attr, DirEntry, FileType, Layout

CHUNK = 1000  # small chunks so tests cross many boundaries
CHAINS = [11, 12, 13]


class FakeStorage:
    """Chunks in a dict; optional gates hold writes/reads so tests can see them in flight."""

    def __init__(self) -> None:
        self.chunks: dict[tuple[int, int], bytearray] = {}
        self.writes: list[tuple[int, int, int, int]] = []  # (inode, index, offset, length)
        self.reads: list[tuple[int, int, int, int]] = []
        self.truncates: list[tuple[int, int, int]] = []
        self.removes: list[tuple[int, int, int, tuple[int, ...]]] = []
        self.write_gate: asyncio.Event | None = None
        self.read_gate: asyncio.Event | None = None
        self.fail_writes = False
        self.fail_index_from: int | None = None  # writes of chunks from this index fail (disk full)
        self.held_writes: list[asyncio.Future[None]] | None = None  # each write waits on its own
        self.inflight_reads = 0
        self.inflight_reads_max = 0
        self.inflight_writes = 0

    async def read_chunk(self, layout: Layout, inode: int, index: int, offset: int, length: int, into: memoryview) -> int:
        self.reads.append((inode, index, offset, length))
        self.inflight_reads += 1
        self.inflight_reads_max = max(self.inflight_reads_max, self.inflight_reads)
        try:
            if self.read_gate is not None:
                await self.read_gate.wait()
            data = self.chunks.get((inode, index), bytearray())
            n = max(0, min(len(data) - offset, length))
            into[:n] = data[offset : offset + n]
            zero_fill(into[n:length])
            return n
        finally:
            self.inflight_reads -= 1

    async def write_chunk(self, layout: Layout, inode: int, index: int, offset: int, data: memoryview) -> None:
        assert offset + len(data) <= layout.chunk_size
        self.inflight_writes += 1
        try:
            if self.write_gate is not None:
                await self.write_gate.wait()
            if self.held_writes is not None:
                fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self.held_writes.append(fut)
                await fut
            if self.fail_writes:
                raise LoomError("disk on fire")
            if self.fail_index_from is not None and index >= self.fail_index_from:
                raise NoSpace("target full")
            self.writes.append((inode, index, offset, len(data)))
            chunk = self.chunks.setdefault((inode, index), bytearray())
            if len(chunk) < offset:
                chunk.extend(bytes(offset - len(chunk)))
            chunk[offset : offset + len(data)] = data
        finally:
            self.inflight_writes -= 1

    async def truncate_chunk(self, layout: Layout, inode: int, index: int, length: int, *,
                             fenced: bool = False) -> None:
        self.truncates.append((inode, index, length))
        chunk = self.chunks.setdefault((inode, index), bytearray())
        del chunk[length:]
        chunk.extend(bytes(length - len(chunk)))

    async def remove_chunks(self, layout: Layout, inode: int, index_begin: int, index_end: int = INDEX_END_ALL, *,
                            keep_versions: bool = False, fenced: bool = False) -> None:
        self.removes.append((inode, index_begin, index_end, tuple(layout.chains)))
        for key in [k for k in self.chunks if k[0] == inode and index_begin <= k[1] < index_end]:
            del self.chunks[key]

    async def remove_file_chunks(self, inode: int, layout: Layout, length: int) -> None:
        await self.remove_chunks(layout, inode, 0, INDEX_END_ALL)

    async def remove_files_chunks(self, files: list[tuple[int, Layout]]) -> None:
        for inode, layout in files:
            await self.remove_chunks(layout, inode, 0, INDEX_END_ALL)

    def content(self, inode: int, length: int, chunk_size: int = CHUNK) -> bytes:
        out = bytearray(length)
        for (ino, idx), data in self.chunks.items():
            if ino == inode:
                start = idx * chunk_size
                seg = data[: max(0, length - start)]
                out[start : start + len(seg)] = seg
        return bytes(out)


class FakeMeta(MetaClient):
    """A flat in-memory namespace implementing the MetaClient calls the core uses.

    Like meta, it cuts the chunks of a shrunk file itself (when given the storage) and keeps
    a truncate epoch per inode: a stale length report does not grow the length."""

    def __init__(self, layout: Layout | None = None, storage: FakeStorage | None = None) -> None:
        super().__init__(None, None)
        self.storage = storage
        self.epochs: dict[int, int] = {}
        self.layout = layout or Layout(chunk_size=CHUNK, chains=list(CHAINS))
        self.nodes: dict[str, Attr] = {"/": Attr(inode=1, type=FileType.DIRECTORY, mode=0o755, nlink=2)}
        self.next_inode = 2
        self.sessions: dict[int, int] = {}
        self.closes: list[tuple[int, int, int]] = []
        self.syncs: list[tuple[int, int]] = []

    def _parent_ok(self, path: str) -> None:
        parent = path.rsplit("/", 1)[0] or "/"
        a = self.nodes.get(parent)
        if a is None:
            raise NotFound(path=path)
        if a.type != FileType.DIRECTORY:
            raise NotADirectory(path=path)

    def _new(self, path: str, type_: int, mode: int, **kw: object) -> Attr:
        self._parent_ok(path)
        attr = Attr(inode=self.next_inode, type=type_, mode=mode, **kw)  # type: ignore[arg-type]
        self.next_inode += 1
        self.nodes[path] = attr
        return attr

    def _get(self, path: str) -> Attr:
        if path not in self.nodes:
            raise NotFound(path=path)
        return self.nodes[path]

    async def stat(self, path: str, follow_symlinks: bool = True) -> Attr:
        return self._get(path)

    async def mkdir(self, path: str, mode: int, parents: bool, exist_ok: bool) -> Attr:
        if path in self.nodes:
            if exist_ok and self.nodes[path].type == FileType.DIRECTORY:
                return self.nodes[path]
            raise AlreadyExists(path=path)
        if parents:
            parent = path.rsplit("/", 1)[0]
            if parent and parent not in self.nodes:
                await self.mkdir(parent, mode, True, True)
        return self._new(path, FileType.DIRECTORY, mode, layout=self.layout)

    async def open(self, path: str, flags: int, mode: int, client_id: int, session_id: int = 0, *,
                   data: bytes | None = None, chunked: bool = False) -> wm.OpenRsp:
        """Files live in chunks here (no inline data): a put (``data``) is answered like a
        directory whose inline limit is 0, an ordinary write open."""
        attr = self.nodes.get(path)
        truncated_from = 0
        if attr is None:
            if not flags & os.O_CREAT:
                raise NotFound(path=path)
            attr = self._new(path, FileType.FILE, mode, layout=self.layout)
        elif flags & os.O_EXCL and flags & os.O_CREAT:
            raise AlreadyExists(path=path)
        elif attr.type == FileType.DIRECTORY:
            raise IsADirectory(path=path)
        if flags & os.O_TRUNC and attr.size:
            truncated_from = attr.size
            await self._cut(attr, 0)
            attr = self.nodes[path] = replace(attr, size=0)
        session = 0
        if flags & (os.O_WRONLY | os.O_RDWR):
            session = 100 + len(self.sessions)
            self.sessions[session] = attr.inode
        return wm.OpenRsp(attr=attr, session_id=session, truncated_from=truncated_from,
                          trunc_epoch=self.epochs.get(attr.inode, 0))

    async def read(self, path: str, follow_symlinks: bool = True) -> wm.ReadRsp:
        return wm.ReadRsp(attr=self._get(path))

    async def _cut(self, attr: Attr, size: int) -> None:
        """A shrink of ``attr`` to ``size``: a new epoch; the chunks past ``size`` are cut."""
        self.epochs[attr.inode] = self.epochs.get(attr.inode, 0) + 1
        if self.storage is None or attr.layout is None:
            return
        cs = attr.layout.chunk_size
        if size % cs:
            await self.storage.truncate_chunk(attr.layout, attr.inode, size // cs, size % cs)
        await self.storage.remove_chunks(attr.layout, attr.inode, -(-size // cs))

    def _by_inode(self, inode: int) -> str:
        return next(p for p, a in self.nodes.items() if a.inode == inode)

    async def close(
        self, inode: int, session_id: int, length: int, mtime_ns: int = 0, *, trunc_epoch: int = 0
    ) -> Attr | None:
        self.closes.append((inode, session_id, length))
        self.sessions.pop(session_id)
        path = self._by_inode(inode)
        if length >= 0 and trunc_epoch >= self.epochs.get(inode, 0):
            self.nodes[path] = replace(self.nodes[path], size=length)
        return self.nodes[path]

    async def sync(self, inode: int, length: int, mtime_ns: int = 0, *, trunc_epoch: int = 0,
                   session_id: int = 0) -> wm.AttrRsp:
        self.syncs.append((inode, length))
        path = self._by_inode(inode)
        epoch = self.epochs.get(inode, 0)
        if length >= 0 and trunc_epoch >= epoch:
            self.nodes[path] = replace(self.nodes[path], size=max(length, self.nodes[path].size))
        return wm.AttrRsp(attr=self.nodes[path], trunc_epoch=epoch)

    async def readdir(self, path: str, after: str, limit: int, with_attrs: bool,
                      dir_inode: int = 0) -> wm.ReaddirRsp:
        d = self._get(path)
        if dir_inode and d.inode != dir_inode:  # as meta: another directory at path now
            raise NotFound(path=path)
        if d.type != FileType.DIRECTORY:
            raise NotADirectory(path=path)
        prefix = path.rstrip("/") + "/"
        names = sorted(p[len(prefix):] for p in self.nodes if p.startswith(prefix) and p != "/" and "/" not in p[len(prefix):])
        names = [n for n in names if n > after]
        page = names[: min(limit, 2)]  # tiny pages so paging is exercised
        entries = [
            DirEntry(name=n, inode=self.nodes[prefix + n].inode, type=self.nodes[prefix + n].type,
                     attr=self.nodes[prefix + n] if with_attrs else None)
            for n in page
        ]
        return wm.ReaddirRsp(entries=entries, more=len(names) > len(page), dir_inode=d.inode)

    async def unlink(self, path: str) -> wm.UnlinkRsp:
        a = self._get(path)
        if a.type == FileType.DIRECTORY:
            raise IsADirectory(path=path)
        del self.nodes[path]
        return wm.UnlinkRsp(inode=a.inode, gc_queued=True)

    async def rmdir(self, path: str) -> wm.UnlinkRsp:
        a = self._get(path)
        if any(p.startswith(path + "/") for p in self.nodes):
            raise LoomError("not empty", errno=39, path=path)
        del self.nodes[path]
        return wm.UnlinkRsp(inode=a.inode)

    async def rename(self, src: str, dst: str, no_replace: bool = False,
                     expect: tuple[int, int, int] | None = None) -> None:
        assert expect is None  # conditional replaces are meta's (tests/unit/test_meta_rename.py)
        a = self._get(src)
        self.nodes[dst] = self.nodes.pop(src)
        assert a is not None

    async def setattr(self, req: wm.SetattrReq) -> wm.SetattrRsp:
        a = self._get(req.path)
        old = a.size
        changes: dict[str, int] = {}
        if req.size >= 0:
            changes["size"] = req.size
            if req.size < old:
                await self._cut(a, req.size)
        if req.mode >= 0:
            changes["mode"] = req.mode
        a = self.nodes[req.path] = replace(a, **changes)  # type: ignore[arg-type]
        return wm.SetattrRsp(attr=a, truncated_from=old if req.size >= 0 else -1,
                             trunc_epoch=self.epochs.get(a.inode, 0))


def make_client(**config: object) -> tuple[AsyncClient, FakeMeta, FakeStorage]:
    """A client over the fakes. "w" opens create at open here (``inline_put_max_bytes=0``)
    unless a test asks for the lazy create: these tests check the chunk write path."""
    storage = FakeStorage()
    meta = FakeMeta(storage=storage)
    config.setdefault("inline_put_max_bytes", 0)
    cfg = ClientConfig(**config)  # type: ignore[arg-type]
    return AsyncClient(meta, storage, config=cfg, client_id=7, pool=BufferPool()), meta, storage


def test_fake_storage_zero_fills_missing_chunks() -> None:
    s = FakeStorage()
    buf = bytearray(b"x" * 10)
    n = asyncio.run(s.read_chunk(Layout(chunk_size=CHUNK, chains=CHAINS), 5, 0, 0, 10, memoryview(buf)))
    assert n == 0 and buf == bytes(10)


def test_fake_meta_requires_parent() -> None:
    with pytest.raises(NotFound):
        asyncio.run(FakeMeta().open("/nope/x", os.O_CREAT | os.O_WRONLY, 0o644, 1))
