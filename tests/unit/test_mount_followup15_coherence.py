"""Follow-up of the session-15 review of the mount's cross-mount coherence: kept write errors
(a lock's reopen, O_APPEND, every descriptor once), the reader refresh of a file whose name
leads elsewhere (settles) or raced by another refresh (one reopen), one STAT per due GETATTR
of a write file, and a listing of a directory with no name here. No FUSE, no sockets: the
mount's handlers over a real AsyncClient on in-memory meta and storage (the fixtures of
test_mount_review15_races)."""

from __future__ import annotations

import asyncio
import errno
import os
from collections import Counter
from dataclasses import replace
from typing import Any

import pyfuse3
import pytest
from test_client_support import FakeMeta
from test_mount_review15_races import _as_due, _file, _ops, _writer

from loomfs.errors import LoomError
from loomfs.mount import revalidate as rv
from loomfs.mount.edge import Handle
from loomfs.mount.ops import LoomOperations
from loomfs.wire import meta as wm
from loomfs.wire.types import Attr


def _counted(meta: FakeMeta, *names: str) -> Counter[str]:
    """Counts of the meta calls ``names`` from now on."""
    calls: Counter[str] = Counter()
    for name in names:
        real = getattr(meta, name)

        def counted(*args: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
            calls[_name] += 1
            return _real(*args, **kw)

        setattr(meta, name, counted)
    return calls


def _longer_at_meta(meta: FakeMeta, path: str) -> None:
    """Meta's STAT of ``path`` says another client made it one byte longer."""
    stat = meta.stat

    async def longer(asked: str, follow_symlinks: bool = True) -> Attr:
        attr = await stat(asked, follow_symlinks)
        return replace(attr, size=attr.size + 1) if asked == path else attr

    meta.stat = longer  # type: ignore[method-assign,assignment]


def _failing_sync(meta: FakeMeta) -> Any:
    """Meta's SYNC fails (EIO) until the returned function puts it back."""
    sync = meta.sync

    async def fail(*args: Any, **kw: Any) -> wm.AttrRsp:
        raise LoomError("storage down", errno=errno.EIO)

    meta.sync = fail  # type: ignore[method-assign]

    def restore() -> None:
        meta.sync = sync  # type: ignore[method-assign]
    return restore


async def _raises_eio(coro: Any) -> None:
    with pytest.raises(pyfuse3.FUSEError) as info:
        await coro
    assert info.value.errno == errno.EIO


# --- 1, 2: write errors reach every descriptor's next fsync or close, once -------------------


def test_an_error_a_getattr_kept_survives_a_lock_grants_reopen(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GETATTR's catch-up kept a failed sync for the descriptors' next fsync/close; a lock
    grant's reopen of the write file (``_reopen_writer``: ``_synced_locked``) took it and only
    logged it, and the application's fsync and close then succeeded."""
    monkeypatch.setattr(rv, "ENABLED", True)
    monkeypatch.setattr(rv.pyfuse3, "invalidate_inode", lambda inode, attr_only: None)

    async def main() -> None:
        ops, _client, meta = await _ops()
        fh, inode, h = await _writer(ops, meta, b"w", b"x" * 10)
        fh2 = (await ops.open(inode, os.O_WRONLY, None)).fh  # a second descriptor, same file
        _as_due(ops, h.file)
        stat = meta.stat
        _longer_at_meta(meta, "/w")
        restore = _failing_sync(meta)
        await ops.getattr(inode, None)  # the catch-up's sync fails: kept
        restore()
        meta.stat = stat  # type: ignore[method-assign]
        old = h.file
        await rv.revalidate(ops, inode)  # a lock granted: the write file is reopened
        assert h.file is not old and not h.file.closed
        await _raises_eio(ops.fsync(fh, False))
        await ops.fsync(fh, False)  # reported once
        await _raises_eio(ops.flush(fh2))  # and once by the other descriptor
        await ops.flush(fh)
        await ops.release(fh)
        await ops.release(fh2)

    asyncio.run(main())


def test_a_failed_sync_of_an_append_write_reaches_the_other_descriptors() -> None:
    """The catch-up before an O_APPEND write failed to sync: that write answered the error,
    and the other descriptors sharing the write file never saw it (Linux reports a writeback
    error to every file open at the time, once each)."""

    async def main() -> None:
        ops, client, meta = await _ops()
        await _file(client, "/log", b"line1\n")
        inode = meta.nodes["/log"].inode
        ops.inodes.remember(inode, "/log")
        app = (await ops.open(inode, os.O_WRONLY | os.O_APPEND, None)).fh
        other = (await ops.open(inode, os.O_WRONLY, None)).fh
        h = ops.handles[app]
        assert isinstance(h, Handle) and ops.handles[other].file is h.file  # type: ignore[union-attr]
        _as_due(ops, h.file)
        stat = meta.stat
        _longer_at_meta(meta, "/log")
        restore = _failing_sync(meta)
        await _raises_eio(ops.write(app, 0, b"line2\n"))
        restore()
        meta.stat = stat  # type: ignore[method-assign]
        await ops.fsync(app, False)  # its write reported it
        await _raises_eio(ops.fsync(other, False))
        await ops.fsync(other, False)
        for fh in (app, other):
            await ops.flush(fh)
            await ops.release(fh)

    asyncio.run(main())


def test_a_failed_fsync_reaches_the_other_descriptors_once() -> None:
    """errseq for plain fsyncs too: descriptor A's fsync meets the error; B's next fsync
    reports it (the client file reports a write error once, to whoever asks first)."""

    async def main() -> None:
        ops, _client, meta = await _ops()
        a, inode, _h = await _writer(ops, meta, b"w", b"x" * 10)
        b = (await ops.open(inode, os.O_WRONLY, None)).fh
        assert await ops.write(a, 10, b"y") == 1
        restore = _failing_sync(meta)
        await _raises_eio(ops.fsync(a, False))
        restore()
        await ops.fsync(a, False)
        await _raises_eio(ops.fsync(b, False))
        await ops.fsync(b, False)
        for fh in (a, b):
            await ops.flush(fh)
            await ops.release(fh)

    asyncio.run(main())


# --- 3, 4: the reader refresh ---------------------------------------------------------------


def _setattr_by_inode(meta: FakeMeta, orphans: dict[int, Attr]) -> None:
    """Meta's SETATTR names the inode (the fake's goes by path): a file wherever it is now,
    or an orphan (``orphans``: nameless, held open)."""
    setattr_ = meta.setattr

    async def by_inode(req: wm.SetattrReq) -> wm.SetattrRsp:
        if req.inode in orphans:
            return wm.SetattrRsp(attr=orphans[req.inode])
        paths = [p for p, a in meta.nodes.items() if a.inode == req.inode]
        return await setattr_(replace(req, path=paths[0]) if paths else req)

    meta.setattr = by_inode  # type: ignore[method-assign]


async def _reader(ops: LoomOperations, client: Any, meta: FakeMeta) -> tuple[int, int, Handle]:
    """A read-only descriptor of /r (made as the open handler does, without the read hold at
    meta, which the fake does not keep)."""
    await _file(client, "/r", b"0123456789")
    inode = (await ops.lookup(1, b"r")).st_ino
    f = await client.open("/r", "rb")
    ops.inodes.opened(inode)
    h = Handle(inode, f, False)
    fh = ops._new_handle(h)
    ops._file_opened(f)
    return fh, inode, h


@pytest.mark.parametrize("made_again", [False, True], ids=["unlinked", "names-another-file"])
def test_a_reader_whose_name_leads_elsewhere_settles(made_again: bool) -> None:
    """Another client unlinked the name of a file open read-only here (and maybe made another
    file by it): meta's attributes by inode (an orphan's, its ctime moved) never matched the
    version the reader opened at, and every GETATTR, and a READ per attr_timeout, cost a
    STAT, a SETATTR by inode and an OPEN (that failed, or opened and closed the other file)."""

    async def main() -> None:
        ops, client, meta = await _ops()
        fh, inode, h = await _reader(ops, client, meta)
        gone = meta.nodes.pop("/r")  # another client: rm r (meta keeps it: held here)
        orphan = replace(gone, nlink=0, ctime_ns=gone.ctime_ns + 1)
        if made_again:
            await _file(client, "/r", b"another file")
        _setattr_by_inode(meta, {inode: orphan})
        calls = _counted(meta, "stat", "setattr", "open")
        assert (await ops.getattr(inode, None)).st_nlink == 0
        settled = dict(calls)
        for _ in range(3):
            assert (await ops.getattr(inode, None)).st_ino == inode
        # by inode only from now on: no STAT by the name, no OPEN
        assert calls["open"] == settled["open"] and calls["stat"] == settled["stat"]
        assert calls["setattr"] == settled["setattr"] + 3
        before = dict(calls)
        for _ in range(3):
            _as_due(ops, h.file)
            assert bytes(await ops.read(fh, 0, 10)) == b"0123456789"  # its own bytes (POSIX)
        assert dict(calls) == before
        await ops.release(fh)
        assert inode not in ops._stale_names

    asyncio.run(main())


def test_a_lookup_of_a_name_leading_to_the_file_again_refreshes_it() -> None:
    """A file settled as unreachable by its name is refreshed again once a LOOKUP finds it."""

    async def main() -> None:
        ops, client, meta = await _ops()
        fh, inode, h = await _reader(ops, client, meta)
        _setattr_by_inode(meta, {})
        moved = meta.nodes.pop("/r")  # mv r r.tmp elsewhere
        meta.nodes["/r.tmp"] = replace(moved, ctime_ns=moved.ctime_ns + 1)  # (a rename moves ctime)
        await ops.getattr(inode, None)
        assert not rv.refreshable(ops, inode)
        meta.nodes["/r"] = meta.nodes.pop("/r.tmp")  # and back
        await _file(client, "/r", b"0123456789abc")  # (same inode: rewritten)
        assert (await ops.lookup(1, b"r")).st_ino == inode
        assert rv.refreshable(ops, inode)
        assert h.file.length == 13
        await ops.release(fh)

    asyncio.run(main())


def test_two_refreshes_at_once_reopen_the_reader_once() -> None:
    """Two GETATTRs that both found a reader at an old version both reopened it; the second's
    new file was swapped into no handle (the first had swapped the old one out) and never
    closed: an open file (and, for a file in chunks, its read hold's twin) leaked."""

    async def main() -> None:
        ops, client, meta = await _ops()
        fh, inode, h = await _reader(ops, client, meta)
        old = h.file
        ops.uses.begin(old)  # a READ of it in flight: its close waits for that read
        await _file(client, "/r", b"0123456789ab")  # another client: the file changed
        opened: list[Any] = []
        gate = asyncio.Event()
        open_ = client.open

        async def gated(path: str, mode: str = "rb", **kw: Any) -> Any:
            await gate.wait()
            f = await open_(path, mode, **kw)
            opened.append(f)
            return f

        client.open = gated
        both = asyncio.gather(ops.getattr(inode, None), ops.getattr(inode, None))
        for _ in range(20):
            await asyncio.sleep(0)  # both GETATTRs up to their reopen
        gate.set()
        await both
        ops.uses.end(old)  # the read ends: the old file closes
        await ops.uses.drain()
        assert old.closed and h.file is opened[0]
        assert len(opened) == 1, "reopened twice"
        assert [f for f in opened if not f.closed] == [h.file]
        await ops.release(fh)

    asyncio.run(main())


# --- 5: one STAT per due GETATTR of a write file ----------------------------------------------


def test_a_due_getattr_of_a_write_file_costs_one_stat() -> None:
    async def main() -> None:
        ops, _client, meta = await _ops()
        fh, inode, h = await _writer(ops, meta, b"w", b"x" * 10)
        calls = _counted(meta, "stat")
        _as_due(ops, h.file)
        assert (await ops.getattr(inode, None)).st_size == 10
        assert calls["stat"] == 1
        _as_due(ops, h.file)
        assert (await ops.lookup(1, b"w")).st_size == 10
        assert calls["stat"] == 2
        await ops.flush(fh)
        await ops.release(fh)

    asyncio.run(main())


def test_a_due_getattr_after_another_client_extended_the_write_file_answers_its_length() -> None:
    """The shared STAT still catches up: meta's longer length reaches the answer."""

    async def main() -> None:
        ops, client, meta = await _ops()
        fh, inode, h = await _writer(ops, meta, b"w", b"x" * 10)
        other = await client.open("/w", "r+b")  # another client appends
        await other.seek(10)
        await other.write(b"yy")
        await other.close()
        _as_due(ops, h.file)
        assert (await ops.getattr(inode, None)).st_size == 12
        assert ops.stats.requests["writer_catch_ups"] == 1
        await ops.flush(fh)
        await ops.release(fh)

    asyncio.run(main())


# --- 6: a listing of a directory with no name here --------------------------------------------


def test_a_listing_of_a_directory_without_a_name_here_lists_no_other_directory(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A LOOKUP miss dropped the directory's name (another client renamed it away and made a
    new directory by its name); its listing went on by the opendir path and gave the kernel
    the new directory's entries as this one's (with lookups counted under its name)."""
    replies: list[bytes] = []
    room = [3]

    def readdir_reply(token: Any, name: bytes, entry: Any, off: int) -> bool:
        if len(replies) >= room[0]:
            return False
        replies.append(name)
        return True

    monkeypatch.setattr(pyfuse3, "readdir_reply", readdir_reply)

    async def main() -> None:
        ops, client, meta = await _ops()
        await meta.mkdir("/d", 0o755, False, False)
        for n in ("a1", "a2", "a3"):
            await _file(client, f"/d/{n}", n.encode())
        d = (await ops.lookup(1, b"d")).st_ino
        fh = await ops.opendir(d, None)
        await ops.readdir(fh, 0, None)  # ".", "..", "a1" (the fake's first page: a1, a2)
        await meta.rename("/d", "/x")  # another client: mv d x; mkdir d; touch d/b1 d/b2
        await meta.mkdir("/d", 0o755, False, False)
        for n in ("b1", "b2"):
            await _file(client, f"/d/{n}", n.encode())
        ops.inodes.missing("/d")  # a LOOKUP of d that missed (the other mount's rename)
        assert not ops.inodes.has_name(d)
        room[0] = 100
        await ops.readdir(fh, 3, None)  # a2 from the page in memory; the next page cannot be asked
        with pytest.raises(pyfuse3.FUSEError) as info:
            await ops.readdir(fh, 4, None)
        assert info.value.errno == errno.ENOENT
        await ops.releasedir(fh)
        assert replies == [b".", b"..", b"a1", b"a2"]
        assert ops.inodes.inode_of("/d/b1") is None

    asyncio.run(main())


def test_a_listing_of_a_directory_without_a_name_here_goes_on_while_its_path_leads_to_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pyfuse3, "readdir_reply", lambda token, name, entry, off: True)

    async def main() -> None:
        ops, client, meta = await _ops()
        await meta.mkdir("/d", 0o755, False, False)
        for n in ("a1", "a2", "a3"):
            await _file(client, f"/d/{n}", n.encode())
        d = (await ops.lookup(1, b"d")).st_ino
        fh = await ops.opendir(d, None)
        ops.inodes.missing("/d")  # a miss meta answered in a moment d was away
        calls = _counted(meta, "stat", "readdir")
        await ops.readdir(fh, 0, None)
        await ops.releasedir(fh)
        # each page asks meta for this directory's inode in the READDIR itself (session 16):
        # no STAT per page any more (there was one per page and one before the end)
        assert calls["readdir"] == 2 and calls["stat"] == 0

    asyncio.run(main())


def test_a_failed_page_is_asked_again_not_taken_for_the_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """A READDIR page meta failed (a transient error) ended the stream's pages iterator with
    the error; the kernel's next READDIR took the dead iterator's end for the directory's: the
    listing ended early, silently, without the names after the failed page (session 16)."""
    replies: list[bytes] = []
    monkeypatch.setattr(pyfuse3, "readdir_reply", lambda token, name, entry, off: replies.append(name) or True)

    async def main() -> None:
        ops, client, meta = await _ops()
        await meta.mkdir("/d", 0o755, False, False)
        for n in ("a1", "a2", "a3", "a4", "a5"):
            await _file(client, f"/d/{n}", n.encode())
        d = (await ops.lookup(1, b"d")).st_ino
        fh = await ops.opendir(d, None)
        readdir = meta.readdir
        fail = [1]

        async def flaky(path: str, after: str, *args: Any, **kw: Any) -> wm.ReaddirRsp:
            if after == "a2" and fail[0]:  # the second page fails once
                fail[0] -= 1
                raise LoomError("meta unavailable", errno=errno.EAGAIN)
            return await readdir(path, after, *args, **kw)

        meta.readdir = flaky  # type: ignore[method-assign]
        await ops.readdir(fh, 0, None)  # ".", "..", a1, a2; the next page fails: what was given stays
        assert replies == [b".", b"..", b"a1", b"a2"]
        await ops.readdir(fh, 4, None)  # the kernel asks again after a2
        await ops.releasedir(fh)
        assert replies == [b".", b"..", b"a1", b"a2", b"a3", b"a4", b"a5"]

    asyncio.run(main())
