"""Inline files (``loomfs.meta.ops.inline``): put, read, patches, truncates, links, GC, and
the crash-safe migration to chunks. A model of the chunks stands in for storage (no sockets)."""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import Iterator
from typing import Any

import crc32c
import pytest
from test_meta_namespace import CREAT, Env
from test_meta_trim import Chunks, _gc, _trimmer

from loomfs.meta.ops.inline import Patch
from loomfs.meta.store.base import InlineData
from loomfs.meta.store.sqlite import SqliteStore
from loomfs.wire.types import Layout

LIMIT = 4096
PUT = os.O_WRONLY | os.O_CREAT | os.O_TRUNC


class WritingChunks(Chunks):
    """The chunk model plus the chunk writes a migration makes (``fail_writes``: storage down)."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_writes = False
        self.before_write: list[object] = []  # coroutines run just before the next write lands

    async def write_chunk(self, layout: Layout, inode: int, index: int, offset: int, data: memoryview) -> None:
        while self.before_write:
            await self.before_write.pop(0)  # type: ignore[misc]
        if self.fail_writes:
            raise OSError(errno.EIO, "storage down")
        self.calls.append(("write", inode, index, len(data)))
        self.write(inode, index * (1 << 20) + offset, bytes(data))


@pytest.fixture
def chunks() -> WritingChunks:
    return WritingChunks()


@pytest.fixture
def env(chunks: WritingChunks) -> Iterator[Env]:
    e = Env(inline_max_bytes=LIMIT, chunk_writer=chunks)
    e.ns.trimmer = _trimmer(e, chunks)
    yield e
    e.close()


def put(env: Env, path: str, data: bytes, flags: int = PUT) -> object:
    return env.run(env.ns.open(path, flags, data=data, data_crc=crc32c.crc32c(data)))


def read(env: Env, path: str) -> bytes | None:
    return env.run(env.ns.read(path))[1]


def row(env: Env, inode: int) -> InlineData | None:
    async def go() -> InlineData | None:
        async with env.store.read() as t:
            return await t.get_inline(inode)

    return env.run(go())


def test_put_is_one_transaction_without_a_session(env: Env) -> None:
    commits = env.store.commits
    o = put(env, "/a", b"hello")
    assert env.store.commits == commits + 1
    assert o.session_id == 0 and o.created and o.attr.inline and o.attr.size == 5  # type: ignore[attr-defined]
    attr, data = env.run(env.ns.read("/a"))
    assert data == b"hello" and attr.inline and attr.layout.inline_max_bytes == LIMIT
    assert env.run(env.ns.stat("/a")).size == 5
    r = env.run(env.ns.open("/a", os.O_RDONLY))
    assert r.data == b"hello" and r.session_id == 0
    put(env, "/a", b"bye")  # O_TRUNC put over an inline file
    assert read(env, "/a") == b"bye" and env.run(env.ns.statfs()).bytes_used == 3
    assert env.err(env.ns.open("/a", os.O_WRONLY | os.O_CREAT | os.O_EXCL, data=b"x")) == errno.EEXIST


def test_put_checks_flags_and_crc(env: Env) -> None:
    assert env.err(env.ns.open("/a", os.O_WRONLY | os.O_CREAT, data=b"x")) == errno.EINVAL  # no O_TRUNC
    assert env.err(env.ns.open("/a", os.O_RDWR | os.O_CREAT | os.O_TRUNC, data=b"x")) == errno.EINVAL
    with pytest.raises(OSError):
        env.run(env.ns.open("/a", PUT, data=b"x", data_crc=crc32c.crc32c(b"y")))
    assert env.err(env.ns.stat("/a")) == errno.ENOENT  # nothing was created


def test_put_too_big_is_an_ordinary_write_open(env: Env) -> None:
    o = put(env, "/big", b"x" * (LIMIT + 1))
    assert o.session_id and not o.attr.inline and o.attr.size == 0  # type: ignore[attr-defined]
    env.run(env.ns.close(o.attr.inode, o.session_id, LIMIT + 1))  # type: ignore[attr-defined]
    assert env.run(env.ns.stat("/big")).size == LIMIT + 1 and read(env, "/big") is None


def test_directory_limit_zero_and_chunked_opens_keep_files_in_chunks(env: Env) -> None:
    env.run(env.ns.mkdir("/off"))
    env.run(env.ns.set_layout("/off", Layout(chunk_size=1 << 20, stripe=4, table_id=1, inline_max_bytes=0)))
    o = put(env, "/off/f", b"tiny")
    assert o.session_id and not o.attr.inline  # type: ignore[attr-defined]
    c = env.run(env.ns.open("/c", CREAT, chunked=True))
    assert c.session_id and not c.attr.inline
    e = env.run(env.ns.open("/e", CREAT))  # a plain create of a small-file directory: inline
    assert e.attr.inline and e.data == b""
    assert env.err(env.ns.set_layout("/off", Layout(chunk_size=1 << 20, inline_max_bytes=2 << 20))) == errno.EINVAL


def test_patches_apply_in_one_transaction_and_close_the_session(env: Env) -> None:
    o = env.run(env.ns.open("/p", CREAT))
    w = env.run(env.ns.write_inline(o.attr.inode, o.session_id, [Patch(0, b"abc"), Patch(6, b"xy"), Patch(1, b"Z")],
                                    close=True))
    assert w.applied and w.attr is not None and w.attr.size == 8
    assert read(env, "/p") == b"aZc\0\0\0xy"

    async def sessions() -> int:
        async with env.store.read() as t:
            return await t.session_count(o.attr.inode)

    assert env.run(sessions()) == 0  # close=True ended the write session in the same transaction
    assert env.err(env.ns.write_inline(o.attr.inode, 0, [Patch(-1, b"x")])) == errno.EINVAL


def test_patches_past_the_limit_migrate_first(env: Env, chunks: WritingChunks) -> None:
    inode = put(env, "/g", b"0123").attr.inode  # type: ignore[attr-defined]
    w = env.run(env.ns.write_inline(inode, 0, [Patch(LIMIT, b"!")]))
    assert not w.applied and w.attr is not None and not w.attr.inline and w.attr.size == 4
    assert chunks.read(inode, 0, 4) == b"0123" and row(env, inode) is None
    assert read(env, "/g") is None  # readers go to the chunks now
    w2 = env.run(env.ns.write_inline(inode, 0, [Patch(0, b"x")]))
    assert not w2.applied  # a file in chunks is left alone


def test_migration_that_fails_leaves_the_file_inline_and_cuts_first_next_time(env: Env, chunks: WritingChunks) -> None:
    inode = put(env, "/m", b"A" * 100).attr.inode  # type: ignore[attr-defined]
    chunks.fail_writes = True
    with pytest.raises(OSError):
        env.run(env.ns.migrate(inode))
    assert read(env, "/m") == b"A" * 100  # still the truth
    r = row(env, inode)
    assert r is not None and r.chunks_dirty
    chunks.fail_writes = False
    chunks.write(inode, 0, b"S" * 3000)  # what the failed attempt might have left, and more
    put(env, "/m", b"B" * 10)
    attr, _ = env.run(env.ns.migrate(inode))
    assert not attr.inline and attr.size == 10
    assert ("remove", inode, 0, -1) in chunks.calls  # cut before the write
    assert chunks.read(inode, 0, 3000) == b"B" * 10 + bytes(2990)


def test_migration_retries_when_the_content_moves_under_it(env: Env, chunks: WritingChunks) -> None:
    inode = put(env, "/r", b"old").attr.inode  # type: ignore[attr-defined]

    async def another_metas_patch() -> None:  # (this meta's own patches wait for the migration)
        async with env.store.write() as txn:
            attr = await txn.get_inode(inode)
            assert attr is not None
            await env.ns._set_inline(txn, attr, b"NEW", env.clock.now_ns())

    chunks.before_write.append(another_metas_patch())
    attr, _ = env.run(env.ns.migrate(inode))
    assert not attr.inline and chunks.read(inode, 0, 3) == b"NEW"
    assert [c[0] for c in chunks.calls].count("write") == 2  # the first copy was stale
    assert env.ns.migrations_total == 1


def test_empty_clean_file_migrates_without_storage() -> None:
    env = Env(inline_max_bytes=LIMIT)  # no chunk writer, no trimmer
    o = env.run(env.ns.open("/e", CREAT))
    attr, _ = env.run(env.ns.migrate(o.attr.inode))
    assert not attr.inline
    env.run(env.ns.close(o.attr.inode, o.session_id, 5))
    assert env.run(env.ns.stat("/e")).size == 5
    o2 = put(env, "/x", b"data")
    assert env.err(env.ns.migrate(o2.attr.inode)) == errno.EIO  # type: ignore[attr-defined]
    assert read(env, "/x") == b"data"
    env.close()


def test_truncates_edit_the_content_and_extend_past_the_limit_migrates(env: Env, chunks: WritingChunks) -> None:
    inode = put(env, "/t", b"abcdef").attr.inode  # type: ignore[attr-defined]
    r = env.run(env.ns.setattr("/t", size=2))
    assert r.attr.inline and r.truncated_from == 6 and read(env, "/t") == b"ab"
    env.run(env.ns.setattr("/t", size=5))
    assert read(env, "/t") == b"ab\0\0\0"
    r = env.run(env.ns.setattr("/t", size=LIMIT * 2))
    assert not r.attr.inline and r.attr.size == LIMIT * 2 and chunks.read(inode, 0, 5) == b"ab\0\0\0"
    env.run(env.ns.open("/t2", CREAT))
    o = env.run(env.ns.open("/t2", os.O_WRONLY | os.O_TRUNC))
    assert o.attr.inline and o.data == b""  # a plain O_TRUNC keeps an inline file inline


def test_put_over_a_file_in_chunks_makes_it_inline_and_cuts_the_old_chunks(env: Env, chunks: WritingChunks) -> None:
    o = env.run(env.ns.open("/c", CREAT, chunked=True))
    chunks.write(o.attr.inode, 0, b"C" * 5000)
    env.run(env.ns.close(o.attr.inode, o.session_id, 5000))
    p = put(env, "/c", b"small")
    assert p.attr.inline and p.truncated_from == 5000 and p.session_id == 0  # type: ignore[attr-defined]
    assert chunks.read(o.attr.inode, 0, 5000) == bytes(5000)  # cut before the reply
    r = row(env, o.attr.inode)
    assert r is not None and r.chunks_dirty and read(env, "/c") == b"small"
    env.run(env.ns.unlink("/c"))
    assert env.run(env.ns.statfs()).gc_pending == 1  # GC removes whatever storage may still hold


def test_links_renames_and_unlinks_of_inline_files(env: Env) -> None:
    inode = put(env, "/a", b"shared").attr.inode  # type: ignore[attr-defined]
    env.run(env.ns.link("/a", "/b"))
    env.run(env.ns.rename("/a", "/c"))
    assert read(env, "/b") == read(env, "/c") == b"shared"
    _, queued = env.run(env.ns.unlink("/c"))
    assert not queued and read(env, "/b") == b"shared"
    put(env, "/d", b"other")
    env.run(env.ns.rename("/d", "/b"))  # replaces the last name of the linked file
    assert read(env, "/b") == b"other" and row(env, inode) is None
    s = env.run(env.ns.statfs())
    assert s.gc_pending == 0 and s.files == 1 and s.bytes_used == 5  # a clean inline file costs storage nothing


def test_rotten_inline_bytes_read_as_eio(env: Env) -> None:
    inode = put(env, "/rot", b"good bytes").attr.inode  # type: ignore[attr-defined]

    async def rot() -> None:
        async with env.store.write() as t:
            r = await t.get_inline(inode)
            assert r is not None
            await t.put_inline(inode, InlineData(b"evil bytes", r.crc, r.version, r.chunks_dirty))

    env.run(rot())
    assert env.err(env.ns.read("/rot")) == errno.EIO
    assert env.err(env.ns.open("/rot", os.O_RDONLY)) == errno.EIO


def test_migration_survives_a_meta_restart(tmp_path: object, chunks: WritingChunks) -> None:
    """A meta that died mid-migration (chunks written, not committed) restarts on the same
    store: the file is inline and whole; once the dead one's claim ran out, its next
    migration cuts the leftovers first."""
    path = os.path.join(str(tmp_path), "meta.db")
    env = Env(inline_max_bytes=LIMIT, chunk_writer=chunks)
    env.store = SqliteStore(path)
    env.ns.store = env.store
    env.run(env.ns.init())
    env.ns.trimmer = _trimmer(env, chunks)
    inode = put(env, "/x", b"Q" * 1000).attr.inode  # type: ignore[attr-defined]

    async def die_after_the_write() -> None:
        raise asyncio.CancelledError  # the process is killed right after the chunk write

    chunks.before_write.append(asyncio.sleep(0))
    real = chunks.write_chunk

    async def write_then_die(*a: object, **k: object) -> None:
        await real(*a, **k)  # type: ignore[arg-type]
        await die_after_the_write()

    chunks.write_chunk = write_then_die  # type: ignore[method-assign]
    with pytest.raises(asyncio.CancelledError):
        env.run(env.ns.migrate(inode))
    chunks.write_chunk = real  # type: ignore[method-assign]
    env.run(env.store.close())
    env2 = Env(inline_max_bytes=LIMIT, chunk_writer=chunks)
    env2.store = SqliteStore(path)
    env2.ns.store = env2.store
    env2.ns.trimmer = _trimmer(env2, chunks)
    assert read(env2, "/x") == b"Q" * 1000
    put(env2, "/x", b"R" * 10)
    env2.ns.migration_wait_s = 0.0
    assert env2.err(env2.ns.migrate(inode)) == errno.EAGAIN  # the dead meta's claim: its copy may land
    env2.clock.advance(env2.ns.migration_claim_s + 1)
    attr, _ = env2.run(env2.ns.migrate(inode))
    assert not attr.inline and chunks.read(inode, 0, 1000) == b"R" * 10 + bytes(990)
    env2.run(env2.store.close())


def _gc_pending(env: Env) -> int:
    return env.run(env.ns.statfs()).gc_pending


# -- migration racing with truncates, unlinks and GC ---------------------------------------


def test_migration_copy_landing_after_an_o_trunc_to_chunks_is_not_resurrected(env: Env, chunks: WritingChunks) -> None:
    """An O_TRUNC open in chunks (a big "w" rewrite) that arrives while a migration's copy
    of the old content is in flight waits for it (else its cut could come before the copy
    lands, leaving old bytes past the new end for an extend to expose)."""
    old = b"S" * 100
    inode = put(env, "/f", old).attr.inode  # type: ignore[attr-defined]
    tasks: list[asyncio.Task[Any]] = []

    async def rewrite_in_chunks() -> None:  # arrives while the copy is in flight
        tasks.append(asyncio.ensure_future(
            env.ns.open("/f", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, chunked=True, client_id=3)))
        await asyncio.sleep(0)

    chunks.before_write.append(rewrite_in_chunks())
    attr, _ = env.run(env.ns.migrate(inode))
    assert not attr.inline
    o = env.run(tasks[0])  # it waited for the migration's copy, then cut it
    env.run(env.ns.close(inode, o.session_id, 0, trunc_epoch=o.trunc_epoch))  # type: ignore[attr-defined]
    env.run(env.ns.setattr("/f", size=100))  # extend: must read zeros
    assert chunks.read(inode, 0, 100) == bytes(100)


def test_migration_copy_landing_after_a_big_put_does_not_corrupt_it(env: Env, chunks: WritingChunks) -> None:
    """Same race with a put too big to be inline (an ordinary write open in chunks): the
    migration's copy of the old content must not land over its writer's bytes."""
    inode = put(env, "/f", b"S" * 100).attr.inode  # type: ignore[attr-defined]
    big = b"B" * (LIMIT + 10)
    tasks: list[asyncio.Task[Any]] = []

    async def big_put_then_write() -> Any:
        o = await env.ns.open("/f", PUT, data=big, data_crc=crc32c.crc32c(big), client_id=3, session_id=11)
        assert o.session_id and not o.attr.inline
        chunks.write(inode, 0, big)  # its writer's chunk writes land
        return o

    async def start() -> None:  # the put arrives while the copy is in flight
        tasks.append(asyncio.ensure_future(big_put_then_write()))
        await asyncio.sleep(0)

    chunks.before_write.append(start())
    env.run(env.ns.migrate(inode))
    o = env.run(tasks[0])
    env.run(env.ns.close(inode, o.session_id, len(big), trunc_epoch=o.trunc_epoch))  # type: ignore[attr-defined]
    assert env.run(env.ns.stat("/f")).size == len(big)
    assert chunks.read(inode, 0, len(big)) == big


def test_unlink_and_gc_during_a_migration_leave_no_orphan_chunk(env: Env, chunks: WritingChunks) -> None:
    """The migration's copy is in flight when the file is unlinked and GC removes its
    chunks (the row was dirty: GC queued with length 0, no trim holds it). The copy then
    lands on storage for an inode that no longer exists and has no GC entry: an orphan."""
    trimmer = env.ns.trimmer
    assert trimmer is not None
    gc = _gc(env, chunks, trimmer)
    gc.delay_s = 0.0
    inode = put(env, "/f", b"D" * 200).attr.inode  # type: ignore[attr-defined]

    async def unlink_and_collect() -> None:
        await env.ns.unlink("/f")
        env.clock.advance(1)
        await gc.run_once()

    chunks.before_write.append(unlink_and_collect())
    with pytest.raises(OSError) as ei:
        env.run(env.ns.migrate(inode))
    assert ei.value.errno == errno.ENOENT
    orphan = [k for k in chunks.data if k[0] == inode]
    assert not orphan or _gc_pending(env) > 0, f"orphan chunks {orphan} of unlinked inode {inode}, nothing queued"


# -- hostile or odd patch lists -----------------------------------------------------------


def test_patches_with_negative_offset_are_refused_even_when_another_patch_grows(env: Env, chunks: WritingChunks) -> None:
    """A patch list with a negative offset is EINVAL when it fits the limit; the same list
    plus one far patch migrates the file to chunks instead (the bad patch is never looked
    at): a malformed request changes the file's state instead of failing."""
    inode = put(env, "/h", b"keep").attr.inode  # type: ignore[attr-defined]
    assert env.err(env.ns.write_inline(inode, 0, [Patch(-3, b"x")])) == errno.EINVAL
    assert env.err(env.ns.write_inline(inode, 0, [Patch(-3, b"x"), Patch(1 << 40, b"y")])) == errno.EINVAL
    assert read(env, "/h") == b"keep"  # still inline, untouched


def test_stale_chunk_writer_reporting_during_a_migration_leaves_no_bytes_past_the_end(
    env: Env, chunks: WritingChunks
) -> None:
    """A writer in chunks whose session expired has not heard of a put (the file is inline
    now); it lands bytes after a migration's cut and reports while the copy is in flight:
    the report bumps the content's version, so the migration starts again and cuts first
    (no stale bytes past the end for an extend to expose)."""
    w = env.run(env.ns.open("/f", CREAT, chunked=True, client_id=1))
    inode = w.attr.inode
    chunks.write(inode, 0, b"o" * 5000)
    env.run(env.ns.sync(inode, 5000, trunc_epoch=w.trunc_epoch))

    async def expire() -> None:  # the writer lost touch with meta for a lease (a put over a
        async with env.store.write() as t:  # file with live writers keeps it in chunks)
            await t.remove_session(inode, w.session_id)

    env.run(expire())
    assert put(env, "/f", b"abc").attr.inline  # type: ignore[attr-defined]  # old chunks cut

    async def stale_writer_lands_and_closes() -> None:
        chunks.write(inode, 3000, b"STALE")
        await env.ns.close(inode, w.session_id, 3005, trunc_epoch=w.trunc_epoch)

    chunks.before_write.append(stale_writer_lands_and_closes())
    attr, _ = env.run(env.ns.migrate(inode))
    assert not attr.inline and attr.size == 3
    env.run(env.ns.setattr("/f", size=4000))  # extend: the new bytes must read zeros
    assert chunks.read(inode, 0, 4000) == b"abc" + bytes(3997)


def test_write_open_of_an_inline_file_does_not_need_storage(env: Env, chunks: WritingChunks) -> None:
    """A put over a file in chunks while storage is down succeeds (its trim is left to GC:
    the old chunks are never read). A later write open of that inline file settles the
    pending trim first and fails with EIO, although its writes go to meta, not storage."""
    o = env.run(env.ns.open("/f", CREAT, chunked=True))
    chunks.write(o.attr.inode, 0, b"C" * 5000)
    env.run(env.ns.close(o.attr.inode, o.session_id, 5000))
    chunks.fail = True  # storage down: cuts fail
    p = put(env, "/f", b"small")
    assert p.attr.inline  # type: ignore[attr-defined]
    env.clock.advance(120)  # past the trim's claim and back-off
    w = env.run(env.ns.open("/f", os.O_WRONLY, client_id=2))
    assert w.attr.inline and w.data == b"small"


def test_setattr_by_inode_changes_that_file_whatever_its_name(env: Env) -> None:
    o = env.run(env.ns.open("/a", CREAT, chunked=True))
    env.run(env.ns.close(o.attr.inode, o.session_id, 100))
    env.run(env.ns.rename("/a", "/b"))
    put(env, "/a", b"a new file at the old name")
    r = env.run(env.ns.setattr("/a", inode=o.attr.inode, size=10))
    assert r.attr.inode == o.attr.inode and r.truncated_from == 100
    assert env.run(env.ns.stat("/b")).size == 10 and read(env, "/a") == b"a new file at the old name"
    env.run(env.ns.unlink("/b"))
    assert env.err(env.ns.setattr("/b", inode=o.attr.inode, size=0)) == errno.ENOENT
    assert env.err(env.ns.setattr("/a", inode=-1, size=0)) == errno.EINVAL


def test_a_chunk_writer_whose_session_expired_under_a_put_gets_eio(env: Env, chunks: WritingChunks) -> None:
    """Inline hunt (session 14): a chunk writer cut off from meta past its lease lost its
    session; a put made the file inline; the writer's fsync learnt the new epoch, it wrote on
    in chunks of an inline file nobody reads, and every later fsync and close succeeded. Bytes
    from before the put are ordered before it (no error); ones written since are reported lost."""
    o = env.run(env.ns.open("/w", CREAT, chunked=True))
    ino = o.attr.inode
    chunks.write(ino, 0, b"o" * 6000)
    env.run(env.ns.sync(ino, 6000, trunc_epoch=o.trunc_epoch))

    async def expire() -> None:
        async with env.store.write() as t:
            await t.remove_session(ino, o.session_id)

    env.run(expire())
    p = put(env, "/w", b"small")
    assert p.attr.inline  # type: ignore[attr-defined]
    r = env.run(env.ns.report(ino, 0, 6000, trunc_epoch=o.trunc_epoch))  # before the put: dropped
    assert r.trunc_epoch > o.trunc_epoch and r.attr is not None and r.attr.size == 5
    assert env.err(env.ns.sync(ino, 8, trunc_epoch=r.trunc_epoch)) == errno.EIO  # written since: lost
    assert env.err(env.ns.close(ino, o.session_id, 8, trunc_epoch=r.trunc_epoch)) == errno.EIO
    assert read(env, "/w") == b"small"


def test_a_migration_copy_landing_during_gcs_removal_is_removed_again() -> None:
    """Inline hunt (session 14): the file was unlinked while its migration's copy was in
    flight; GC's removal reached storage first, the copy landed after it, the migration saw
    GC's entry still queued and did not queue it again, then GC deleted its entry: the copied
    chunk stayed on storage for ever. The migration queues a fresh entry, which a removal in
    flight does not delete."""
    chunks = WritingChunks()
    env = Env(inline_max_bytes=LIMIT, chunk_writer=chunks)
    env.ns.trimmer = _trimmer(env, chunks)
    gc = _gc(env, chunks, env.ns.trimmer)
    gc.delay_s = 0.0
    inode = put(env, "/f", b"D" * 200).attr.inode  # type: ignore[attr-defined]
    removed = asyncio.Event()
    release: asyncio.Future[None] | None = None
    real_remove = chunks.remove_files_chunks
    tasks: list[asyncio.Future[int]] = []

    async def slow_remove(files: list[tuple[int, Layout]]) -> None:
        await real_remove(files)  # GC's removal reaches storage...
        removed.set()
        assert release is not None
        await release  # ...its reply (and GC's delete of its entry) comes later

    chunks.remove_files_chunks = slow_remove  # type: ignore[method-assign]

    async def unlink_and_start_gc() -> None:
        nonlocal release
        release = asyncio.get_running_loop().create_future()
        await env.ns.unlink("/f")
        env.clock.advance(1)
        tasks.append(asyncio.ensure_future(gc.run_once()))
        await removed.wait()  # the removal is done on storage; now the copy lands

    chunks.before_write.append(unlink_and_start_gc())

    async def main() -> None:
        with pytest.raises(OSError) as ei:
            await env.ns.migrate(inode)
        assert ei.value.errno == errno.ENOENT
        assert release is not None
        release.set_result(None)
        await tasks[0]

    try:
        env.run(main())
        orphan = [k for k in chunks.data if k[0] == inode]
        assert not orphan or _gc_pending(env) > 0, f"chunks {orphan} of a gone inode, nothing queued"
        env.clock.advance(1)
        env.run(gc.run_once())  # the next round removes them
        assert not [k for k in chunks.data if k[0] == inode]
    finally:
        env.close()


def test_a_writers_patches_wait_for_a_migration_in_progress() -> None:
    """Inline hunt (session 14): another writer's patches, applied while a migration copied
    the content, moved its version every round: the migrating writer's write past the limit
    failed with EAGAIN. Patches arriving during a migration wait for it, then find the file in
    chunks (applied=False: their writer sends them there)."""
    chunks = WritingChunks()
    env = Env(inline_max_bytes=LIMIT, chunk_writer=chunks)
    env.ns.trimmer = _trimmer(env, chunks)
    inode = put(env, "/f", b"a" * 100).attr.inode  # type: ignore[attr-defined]
    other = env.run(env.ns.open("/f", os.O_RDWR, client_id=7))
    me = env.run(env.ns.open("/f", os.O_RDWR, client_id=8))
    real = chunks.write_chunk
    flushes: list[asyncio.Future[Any]] = []

    async def write_chunk(*a: Any, **k: Any) -> None:  # the other writer flushes during every copy
        flushes.append(asyncio.ensure_future(env.ns.write_inline(inode, other.session_id, [Patch(101, b"L")])))
        for _ in range(20):
            await asyncio.sleep(0)
        await real(*a, **k)

    chunks.write_chunk = write_chunk  # type: ignore[method-assign]

    async def main() -> None:
        w = await env.ns.write_inline(inode, me.session_id, [Patch(LIMIT, b"x")])
        assert not w.applied and w.attr is not None and not w.attr.inline  # migrated: on in chunks
        got = await asyncio.gather(*flushes)
        assert len(got) == 1 and not got[0].applied  # waited, then told: the file is in chunks

    try:
        env.run(main())
    finally:
        env.close()
