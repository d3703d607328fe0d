"""Crash-safe truncates (``loomfs.meta.trim``): the trim is queued with the length change, cut
before any later write may land (also after a crash), and a stale writer cannot grow a length
back past a truncate. A model of the chunks stands in for storage (no sockets, ManualClock)."""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import Iterator

import pytest
from test_meta_namespace import CREAT, Env

from loomfs.errors import StatusError
from loomfs.meta.gc import GcWorker
from loomfs.meta.store.base import TrimEntry
from loomfs.meta.trim import Trimmer, merge
from loomfs.wire.types import Layout

W = os.O_WRONLY
MIB = 1 << 20  # Env's chunk size


class Chunks:
    """Chunk contents per (inode, index), with the storage calls meta's trims and GC make."""

    def __init__(self) -> None:
        self.data: dict[tuple[int, int], bytearray] = {}
        self.calls: list[tuple[str, int, int, int]] = []  # (call, inode, index, length|-1)
        self.fail = False
        self.gate: asyncio.Event | None = None  # holds every cut while set and not yet fired

    async def _enter(self) -> None:
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise OSError(errno.EIO, "storage down")

    async def truncate_chunk(self, layout: Layout, inode: int, index: int, length: int, *,
                             fenced: bool = False) -> None:
        assert fenced  # the trimmer's cuts are always fenced
        await self._enter()
        self.calls.append(("truncate", inode, index, length))
        chunk = self.data.setdefault((inode, index), bytearray())
        del chunk[length:]
        chunk.extend(bytes(length - len(chunk)))

    async def remove_chunks(self, layout: Layout, inode: int, index_begin: int, index_end: int = 1 << 62, *,
                            keep_versions: bool = False, fenced: bool = False) -> None:
        assert fenced or not keep_versions  # the trimmer's cuts are fenced, GC's removals need not be
        await self._enter()
        self.calls.append(("remove", inode, index_begin, -1))
        for key in [k for k in self.data if k[0] == inode and index_begin <= k[1] < index_end]:
            del self.data[key]

    async def remove_files_chunks(self, files: list[tuple[int, Layout]]) -> None:
        for inode, layout in files:
            await self.remove_chunks(layout, inode, 0)

    def write(self, inode: int, offset: int, payload: bytes) -> None:
        """A client's write landing on storage."""
        done = 0
        while done < len(payload):
            index, off = divmod(offset + done, MIB)
            n = min(MIB - off, len(payload) - done)
            chunk = self.data.setdefault((inode, index), bytearray())
            if len(chunk) < off:
                chunk.extend(bytes(off - len(chunk)))
            chunk[off : off + n] = payload[done : done + n]
            done += n

    def read(self, inode: int, offset: int, length: int) -> bytes:
        """Holes and missing chunks read as zeros."""
        out = bytearray(length)
        done = 0
        while done < length:
            index, off = divmod(offset + done, MIB)
            n = min(MIB - off, length - done)
            seg = self.data.get((inode, index), b"")[off : off + n]
            out[done : done + len(seg)] = seg
            done += n
        return bytes(out)


@pytest.fixture
def env() -> Iterator[Env]:
    e = Env()
    yield e
    e.close()


def _trimmer(env: Env, chunks: Chunks, **kw: float) -> Trimmer:
    opts: dict[str, float] = {"wait_s": 0.0, **kw}
    return Trimmer(env.store, chunks, clock=env.clock, owner=0x1111, **opts)  # type: ignore[arg-type]


def _with_trimmer(env: Env, chunks: Chunks, **kw: float) -> Trimmer:
    t = env.ns.trimmer = _trimmer(env, chunks, **kw)
    return t


def _gc(env: Env, chunks: Chunks, trimmer: Trimmer) -> GcWorker:
    return GcWorker(env.store, chunks, delay_s=60.0, clock=env.clock, trimmer=trimmer)


async def make_file(env: Env, chunks: Chunks, path: str, size: int, fill: bytes = b"o") -> int:
    """A closed file of ``size`` bytes of ``fill`` (on the chunk model too)."""
    o = await env.ns.open(path, CREAT)
    chunks.write(o.attr.inode, 0, fill * size)
    await env.ns.close(o.attr.inode, o.session_id, size, trunc_epoch=o.trunc_epoch)
    return o.attr.inode


def _file(env: Env, chunks: Chunks, path: str, size: int, fill: bytes = b"o") -> int:
    return env.run(make_file(env, chunks, path, size, fill))


async def entry_of(env: Env, inode: int) -> TrimEntry | None:
    async with env.store.read() as t:
        return await t.trim_get(inode)


def _entry(env: Env, inode: int) -> TrimEntry | None:
    return env.run(entry_of(env, inode))


async def epoch_of(env: Env, inode: int) -> int:
    async with env.store.read() as t:
        return await t.trunc_epoch(inode)


def _epoch(env: Env, inode: int) -> int:
    return env.run(epoch_of(env, inode))


# -- the trim is queued with the length change ---------------------------------------------


def test_shrink_queues_trim_and_epoch_in_its_transaction(env: Env) -> None:
    chunks = Chunks()
    ino = _file(env, chunks, "/f", 3 * MIB)
    # no trimmer: a meta that committed the truncate and died before cutting anything
    r = env.run(env.ns.setattr("/f", size=MIB + 7))
    assert r.attr.size == MIB + 7 and r.truncated_from == 3 * MIB and r.trunc_epoch == 1
    e = _entry(env, ino)
    assert e is not None and (e.length, e.old_length, e.idle, e.generation) == (MIB + 7, 3 * MIB, False, 1)
    assert e.layout == r.attr.layout and e.claim_owner == 0
    assert env.run(env.ns.statfs()).trims_pending == 1
    assert chunks.calls == []

    # a failing transaction commits neither the length nor the trim
    async def failing() -> None:
        async with env.store.write() as t:
            attr = await t.get_inode(ino)
            assert attr is not None
            await env.ns._shrink(t, attr, 5, env.clock.now_ns())
            raise RuntimeError("crash inside the transaction")

    with pytest.raises(RuntimeError):
        env.run(failing())
    e2 = _entry(env, ino)
    assert e2 == e and _epoch(env, ino) == 1 and env.run(env.ns.stat("/f")).size == MIB + 7


def test_truncate_cuts_before_it_answers(env: Env) -> None:
    chunks = Chunks()
    trimmer = _with_trimmer(env, chunks)
    ino = _file(env, chunks, "/f", 3 * MIB)
    r = env.run(env.ns.setattr("/f", size=MIB + 7))
    assert sorted(chunks.calls) == [("remove", ino, 2, -1), ("truncate", ino, 1, 7)]
    assert _entry(env, ino) is None and sorted(k[1] for k in chunks.data if k[0] == ino) == [0, 1]
    assert r.trunc_epoch == 1 and trimmer.trims_total == 1
    chunks.calls.clear()
    env.run(env.ns.setattr("/f", size=MIB))  # on a chunk boundary: nothing to truncate
    assert chunks.calls == [("remove", ino, 1, -1)]
    chunks.calls.clear()
    env.run(env.ns.setattr("/f", size=MIB))  # same size: no trim, no new epoch
    env.run(env.ns.setattr("/f", mode=0o600))
    assert chunks.calls == [] and _epoch(env, ino) == 2
    # O_TRUNC: every chunk goes before the writer gets its session
    o = env.run(env.ns.open("/f", W | os.O_TRUNC, client_id=5))
    assert chunks.calls == [("remove", ino, 0, -1)] and not any(k[0] == ino for k in chunks.data)
    assert o.trunc_epoch == 3 and o.truncated_from == MIB and _entry(env, ino) is None
    assert "trims=3" in repr(trimmer)


def test_gc_cuts_a_trim_a_crash_left_and_an_extend_reads_zeros(env: Env) -> None:
    chunks = Chunks()
    ino = _file(env, chunks, "/f", 3 * MIB, b"o")
    env.run(env.ns.setattr("/f", size=MIB + 7))  # committed; the meta died before the cut
    trimmer = _trimmer(env, chunks)
    env.ns.trimmer = trimmer  # the restarted meta
    gc = _gc(env, chunks, trimmer)
    assert env.run(gc.run_once()) == 1  # due at once: no claim
    assert _entry(env, ino) is None and "trims=1" in repr(gc)
    assert env.run(gc.run_once()) == 0  # done once
    env.run(env.ns.setattr("/f", size=3 * MIB))  # extend: the old bytes past MIB + 7 are gone
    assert chunks.read(ino, 0, 3 * MIB) == b"o" * (MIB + 7) + bytes(2 * MIB - 7)


def test_a_dead_metas_claim_is_taken_over_after_it_runs_out(env: Env) -> None:
    chunks = Chunks()
    dead = _trimmer(env, chunks)
    dead.owner = 0xDEAD
    env.ns.trimmer = dead
    ino = _file(env, chunks, "/f", 2 * MIB)

    async def commit_only() -> None:  # the shrink's transaction, then the process died
        async with env.store.write() as t:
            attr = await t.get_inode(ino)
            assert attr is not None
            await env.ns._shrink(t, attr, 10, env.clock.now_ns())

    env.run(commit_only())
    trimmer = _with_trimmer(env, chunks)
    gc = _gc(env, chunks, trimmer)
    assert env.run(gc.run_once()) == 0 and chunks.calls == []  # the claim may still be cutting
    assert env.err(env.ns.open("/f", W)) == errno.EAGAIN  # no write session while it may run
    env.clock.advance(trimmer.claim_s)
    assert env.run(gc.run_once()) == 1
    assert sorted(chunks.calls) == [("remove", ino, 1, -1), ("truncate", ino, 0, 10)]


def test_failed_cut_keeps_the_entry_and_backs_off(env: Env) -> None:
    chunks = Chunks()
    trimmer = _with_trimmer(env, chunks)
    gc = _gc(env, chunks, trimmer)
    ino = _file(env, chunks, "/f", 2 * MIB)
    chunks.fail = True
    assert env.err(env.ns.setattr("/f", size=0)) == errno.EIO  # committed, not cut: the caller hears
    assert env.run(env.ns.stat("/f")).size == 0
    e = _entry(env, ino)
    assert e is not None and e.claim_owner == 0 and trimmer.failures_total == 1
    chunks.fail = False
    assert env.run(gc.run_once()) == 0  # backing off
    env.clock.advance(trimmer.retry_s)
    assert env.run(gc.run_once()) == 1 and _entry(env, ino) is None
    assert not any(k[0] == ino for k in chunks.data)


def test_a_cut_that_hangs_fences_the_entry_for_a_claim(env: Env) -> None:
    async def go() -> None:
        chunks = Chunks()
        trimmer = _with_trimmer(env, chunks, cut_timeout_s=0)
        ino = await make_file(env, chunks, "/f", MIB)
        chunks.gate = asyncio.Event()  # storage never answers
        with pytest.raises(OSError) as ei:
            await env.ns.setattr("/f", size=0)
        assert ei.value.errno == errno.EIO
        e = await entry_of(env, ino)
        assert e is not None and e.claim_owner == 0
        assert e.claim_until_ns == env.clock.now_ns() + int(trimmer.claim_s * 1e9)  # its calls may still land
        with pytest.raises(OSError) as ei:
            await env.ns.open("/f", W)
        assert ei.value.errno == errno.EAGAIN

    env.run(go())


# -- trims versus later writes ------------------------------------------------------------


def test_truncate_to_zero_crash_then_rewrite_keeps_the_new_data(env: Env) -> None:
    # truncate to 0 commits, the meta dies before the cut; a writer re-extends the file. The
    # trim of the old chunks must not remove the new bytes, and no old byte may show in a hole.
    chunks = Chunks()
    ino = _file(env, chunks, "/f", 3 * MIB, b"o")
    env.run(env.ns.setattr("/f", size=0))  # no trimmer: the crash
    trimmer = _with_trimmer(env, chunks)  # the restarted meta, before its GC ran
    w = env.run(env.ns.open("/f", W, client_id=5))  # settles the trim before the session is handed out
    assert not any(k[0] == ino for k in chunks.data) and _entry(env, ino) is None
    chunks.write(ino, 2 * MIB, b"new")  # a sparse write past the old chunks
    env.run(env.ns.close(ino, w.session_id, 2 * MIB + 3, trunc_epoch=w.trunc_epoch))
    gc = _gc(env, chunks, trimmer)
    env.clock.advance(3600)
    assert env.run(gc.run_once()) == 0  # nothing left to cut
    assert env.run(env.ns.stat("/f")).size == 2 * MIB + 3
    assert chunks.read(ino, 0, 2 * MIB + 3) == bytes(2 * MIB) + b"new"


def test_a_write_open_waits_for_a_cut_in_flight(env: Env) -> None:
    async def go() -> None:
        chunks = Chunks()
        _with_trimmer(env, chunks)
        ino = await make_file(env, chunks, "/f", 2 * MIB)
        chunks.gate = asyncio.Event()
        truncating = asyncio.ensure_future(env.ns.setattr("/f", size=0))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not truncating.done()  # cutting
        opening = asyncio.ensure_future(env.ns.open("/f", W, client_id=5))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not opening.done()  # the session is not handed out while the cut runs
        chunks.gate.set()
        await truncating
        o = await opening
        assert o.trunc_epoch == 1 and not any(k[0] == ino for k in chunks.data)
        assert len(chunks.calls) == 1  # one cut, not one per caller

    env.run(go())


def test_an_extend_cuts_the_pending_trim_first(env: Env) -> None:
    chunks = Chunks()
    ino = _file(env, chunks, "/f", 2 * MIB, b"o")
    env.run(env.ns.setattr("/f", size=5))  # crash: not cut
    _with_trimmer(env, chunks)
    env.run(env.ns.setattr("/f", size=2 * MIB))  # cuts first, then grows
    assert chunks.read(ino, 0, 2 * MIB) == b"o" * 5 + bytes(2 * MIB - 5)
    assert _entry(env, ino) is None


def test_shrinks_merge_and_a_performer_cuts_again(env: Env) -> None:
    async def go() -> None:
        chunks = Chunks()
        _with_trimmer(env, chunks)
        ino = await make_file(env, chunks, "/f", 3 * MIB)
        chunks.gate = asyncio.Event()
        first = asyncio.ensure_future(env.ns.setattr("/f", size=2 * MIB + 1))
        for _ in range(5):
            await asyncio.sleep(0)
        second = asyncio.ensure_future(env.ns.setattr("/f", size=MIB + 1))
        for _ in range(5):
            await asyncio.sleep(0)
        e = await entry_of(env, ino)
        assert e is not None and e.length == MIB + 1 and e.old_length == 3 * MIB and e.generation == 2
        chunks.gate.set()
        await first
        await second
        assert await entry_of(env, ino) is None and await epoch_of(env, ino) == 2
        assert ("truncate", ino, 1, 1) in chunks.calls and ("remove", ino, 2, -1) in chunks.calls
        assert sorted(k[1] for k in chunks.data if k[0] == ino) == [0, 1] and len(chunks.data[(ino, 1)]) == 1

    env.run(go())


def test_merge_rules() -> None:
    lay = Layout(chunk_size=MIB, chains=[1])
    a = TrimEntry(7, lay, 100, 500, True, 0, 10)
    m = merge(None, a, 0)
    assert m.generation == 1 and m.idle
    b = TrimEntry(7, lay, 50, 300, False, 0, 20, claim_owner=2, claim_until_ns=99)
    m2 = merge(m, b, 0)
    assert (m2.length, m2.old_length, m2.idle, m2.generation, m2.enqueued_ns) == (50, 500, False, 2, 10)
    assert (m2.claim_owner, m2.claim_until_ns) == (2, 99)
    c = TrimEntry(7, lay, 70, 70, False, 0, 30, claim_owner=3, claim_until_ns=200)
    assert (merge(m2, c, 50).claim_owner, merge(m2, c, 100).claim_owner) == (2, 3)  # a live claim stays


def test_unlink_waits_for_a_claimed_trim(env: Env) -> None:
    chunks = Chunks()
    other = _trimmer(env, chunks, claim_s=120)
    other.owner = 0xBEEF  # another meta claimed it and is cutting
    env.ns.trimmer = other
    ino = _file(env, chunks, "/f", MIB)

    async def commit_only() -> None:
        async with env.store.write() as t:
            attr = await t.get_inode(ino)
            assert attr is not None
            await env.ns._shrink(t, attr, 10, env.clock.now_ns())

    env.run(commit_only())
    trimmer = _with_trimmer(env, chunks)
    env.run(env.ns.unlink("/f"))
    assert _entry(env, ino) is not None  # its performer drops it
    gc = _gc(env, chunks, trimmer)
    env.clock.advance(60)
    assert env.run(gc.run_once()) == 0 and chunks.calls == []  # no removal while a cut may land
    env.clock.advance(60)
    # the trim goes (nothing to cut: the file is gone), then the file's chunks
    assert env.run(gc.run_once()) == 2 and _entry(env, ino) is None
    assert chunks.calls == [("remove", ino, 0, -1)] and "removed=1" in repr(gc)


def test_unlink_drops_an_unclaimed_trim(env: Env) -> None:
    chunks = Chunks()
    ino = _file(env, chunks, "/f", MIB)
    env.run(env.ns.setattr("/f", size=3))  # no trimmer: queued, unclaimed
    env.run(env.ns.unlink("/f"))
    assert _entry(env, ino) is None and _epoch(env, ino) == 0


# -- stale writers ------------------------------------------------------------------------


def test_stale_close_does_not_resurrect_the_length(env: Env) -> None:
    chunks = Chunks()
    _with_trimmer(env, chunks)
    w = env.run(env.ns.open("/f", CREAT, client_id=1))
    ino = w.attr.inode
    chunks.write(ino, 0, b"w" * (2 * MIB))  # written, not yet reported
    env.run(env.ns.setattr("/f", size=0))  # another client truncates
    chunks.write(ino, MIB + 5, b"late")  # the writer's flush that landed after the cut
    a = env.run(env.ns.close(ino, w.session_id, 2 * MIB, trunc_epoch=w.trunc_epoch))
    assert a is not None and a.size == 0  # not 2 MiB again
    assert _entry(env, ino) is None and not any(k[0] == ino for k in chunks.data)  # its tail was cut
    env.run(env.ns.setattr("/f", size=2 * MIB))
    assert chunks.read(ino, 0, 2 * MIB) == bytes(2 * MIB)


def test_stale_sync_hands_out_the_new_epoch_and_later_writes_count(env: Env) -> None:
    chunks = Chunks()
    _with_trimmer(env, chunks)
    w = env.run(env.ns.open("/f", CREAT, client_id=1))
    ino = w.attr.inode
    env.run(env.ns.sync(ino, 4000, trunc_epoch=w.trunc_epoch))
    env.run(env.ns.setattr("/f", size=100))
    r = env.run(env.ns.report(ino, 0, 8000, trunc_epoch=w.trunc_epoch))  # fsync, not knowing
    assert r.attr is not None and r.attr.size == 100 and r.trunc_epoch == 1
    e = _entry(env, ino)
    assert e is not None and e.idle and e.length == 100  # cut once the writer is gone
    r2 = env.run(env.ns.report(ino, w.session_id, 300, trunc_epoch=r.trunc_epoch, end=True))
    assert r2.attr is not None and r2.attr.size == 300  # written after it learned: counts
    assert _entry(env, ino) is None and ("remove", ino, 1, -1) in chunks.calls
    assert ("truncate", ino, 0, 300) in chunks.calls  # cut at the length the file has now


def test_stale_tail_waits_while_another_writer_is_open(env: Env) -> None:
    chunks = Chunks()
    trimmer = _with_trimmer(env, chunks)
    gc = _gc(env, chunks, trimmer)
    stale = env.run(env.ns.open("/f", CREAT, client_id=1))
    ino = stale.attr.inode
    env.run(env.ns.setattr("/f", size=0))
    fresh = env.run(env.ns.open("/f", W, client_id=2))
    chunks.write(ino, 0, b"fresh!")  # not yet reported
    chunks.write(ino, 100, b"stale")
    env.run(env.ns.close(ino, stale.session_id, 105, trunc_epoch=stale.trunc_epoch))
    assert env.run(env.ns.stat("/f")).size == 0
    assert env.run(gc.run_once()) == 0  # a writer is open: its bytes are not cut under it
    assert chunks.read(ino, 0, 6) == b"fresh!"
    env.run(env.ns.close(ino, fresh.session_id, 6, trunc_epoch=fresh.trunc_epoch))
    assert env.run(env.ns.stat("/f")).size == 6 and _entry(env, ino) is None  # cut at the close
    assert chunks.read(ino, 0, 105) == b"fresh!" + bytes(99)


def test_reports_at_the_current_epoch_grow_as_before(env: Env) -> None:
    w = env.run(env.ns.open("/f", CREAT, client_id=1))
    ino = w.attr.inode
    assert w.trunc_epoch == 0
    assert env.run(env.ns.sync(ino, 500)).size == 500
    env.run(env.ns.setattr("/f", size=10))
    assert env.run(env.ns.sync(ino, 700, trunc_epoch=1)).size == 700
    assert env.run(env.ns.sync(ino, 900, trunc_epoch=5)).size == 900  # newer than known: trusted
    r = env.run(env.ns.report(ino, w.session_id, -1, trunc_epoch=0, end=True))  # wrote nothing more
    assert r.attr is not None and r.attr.size == 900 and r.trunc_epoch == 1


def test_a_failed_o_trunc_open_leaves_no_session(env: Env) -> None:
    chunks = Chunks()
    _with_trimmer(env, chunks)
    ino = _file(env, chunks, "/f", MIB)
    chunks.fail = True
    assert env.err(env.ns.open("/f", W | os.O_TRUNC, client_id=5)) == errno.EIO
    has = env.run(_has_session(env, ino))
    assert not has and _entry(env, ino) is not None  # the trim stays queued for GC


async def _has_session(env: Env, inode: int) -> bool:
    async with env.store.read() as t:
        return await t.has_session(inode)


def test_size_sets_under_open_writers_are_shrinks(env: Env) -> None:
    # meta's length lags what open writers wrote; a truncate (even to a larger size than meta
    # knows) cuts their unreported bytes past it, and their stale reports do not count
    chunks = Chunks()
    _with_trimmer(env, chunks)
    w = env.run(env.ns.open("/f", CREAT, client_id=1))
    ino = w.attr.inode
    chunks.write(ino, 0, b"w" * (MIB + 50))  # unreported
    r = env.run(env.ns.setattr("/f", size=10))  # meta's length is 0: an extend, for meta
    assert r.trunc_epoch == 1 and ("truncate", ino, 0, 10) in chunks.calls
    assert env.run(env.ns.close(ino, w.session_id, MIB + 50, trunc_epoch=w.trunc_epoch)).size == 10
    assert chunks.read(ino, 0, 20) == b"w" * 10 + bytes(10)
    # O_TRUNC of an empty file with a writer open is one too
    w2 = env.run(env.ns.open("/f", W, client_id=1))
    chunks.write(ino, 0, b"x" * 100)
    o = env.run(env.ns.open("/f", W | os.O_TRUNC, client_id=2))
    assert o.trunc_epoch == w2.trunc_epoch + 1 and chunks.read(ino, 0, 100) == bytes(100)
    # without writers, an extend is only metadata
    env.run(env.ns.close(ino, w2.session_id, 100, trunc_epoch=w2.trunc_epoch))
    env.run(env.ns.close(ino, o.session_id, -1, trunc_epoch=o.trunc_epoch))
    chunks.calls.clear()
    assert env.run(env.ns.setattr("/f", size=5000)).trunc_epoch == o.trunc_epoch and chunks.calls == []


def test_an_erasure_coded_file_is_cut_by_whole_stripes(env: Env) -> None:
    """EC request 2: the replicated cut (chunks past ceil(len/cs), the last one truncated)
    destroyed live fragments; an EC file loses whole stripes past the end (and their shadow
    copies), never a fragment of a stripe it keeps."""
    from loomfs.ec.stripe import SHADOW_STRIPE_BASE, Geometry

    chunks = Chunks()
    layout = Layout(chunk_size=MIB, chains=list(range(1, 7)), ec_k=4, ec_m=2)
    g = Geometry(4, 2, MIB)
    ino = 77
    live = {(ino, g.chunk_index(s, j)) for s in range(3) for j in range(6)}
    shadow = {(ino, g.chunk_index(s, j, shadow=True)) for s in range(3) for j in range(6)}
    for key in live | shadow:
        chunks.data[key] = bytearray(b"f")
    reencoded: list[tuple[int, int]] = []

    async def stripe_cutter(lay: Layout, inode: int, length: int) -> None:
        assert lay is layout
        reencoded.append((inode, length))

    t = _trimmer(env, chunks)
    with pytest.raises(StatusError):  # a partial last stripe and nothing to re-encode it: not cut
        env.run(t._cut(layout, ino, 4 * MIB + 1))
    t.stripe_cutter = stripe_cutter
    env.run(t._cut(layout, ino, 4 * MIB + 1))  # two stripes kept (the second one partial)
    kept = {(ino, g.chunk_index(s, j)) for s in range(2) for j in range(6)}
    kept |= {(ino, g.chunk_index(s, j, shadow=True)) for s in range(2) for j in range(6)}
    assert set(chunks.data) == kept
    assert all(c[0] == "remove" for c in chunks.calls)  # no fragment truncated
    assert reencoded == [(ino, 4 * MIB + 1)]  # the second stripe re-encoded without its tail
    assert SHADOW_STRIPE_BASE * 6 > max(k[1] for k in live)
    env.run(t._cut(layout, ino, 4 * MIB))  # on a stripe boundary: nothing to re-encode
    assert reencoded == [(ino, 4 * MIB + 1)]


def test_a_write_open_waits_for_an_idle_cut_in_flight(env: Env) -> None:
    """Review (session 14): an idle trim's cut (an EC file's stripe re-encode, a read-modify-
    write) ran while a fresh writer's OPEN answered without waiting: the open's own session
    made the idle entry look like one to leave for later. A claimed idle entry is settled."""
    from loomfs.wire.types import Layout as _Layout

    async def go() -> None:
        chunks = Chunks()
        t = _with_trimmer(env, chunks)
        gate, started = asyncio.Event(), asyncio.Event()
        calls: list[int] = []
        hold = False

        async def stripe_cutter(layout: _Layout, inode: int, length: int) -> None:
            calls.append(length)
            if hold:
                started.set()
                await gate.wait()  # the stripe read, its fragment writes in flight

        t.stripe_cutter = stripe_cutter
        await env.ns.set_layout("/", _Layout(chunk_size=MIB, table_id=1, ec_k=4, ec_m=2))
        stale = await env.ns.open("/f", CREAT, client_id=1)
        ino = stale.attr.inode
        await env.ns.sync(ino, 4000, trunc_epoch=stale.trunc_epoch)
        await env.ns.setattr("/f", size=100)  # another client truncates (cut at once)
        calls.clear()
        hold = True
        # the stale writer closes reporting past the length: an idle trim, cut at its close
        closing = asyncio.ensure_future(env.ns.close(ino, stale.session_id, 8000, trunc_epoch=stale.trunc_epoch))
        await asyncio.wait_for(started.wait(), 5)
        assert calls == [100]
        opening = asyncio.ensure_future(env.ns.open("/f", os.O_WRONLY, client_id=2))
        for _ in range(50):
            await asyncio.sleep(0)
        answered_during_cut = opening.done()
        gate.set()
        await closing
        o = await opening
        assert not answered_during_cut, "a writer got its session while the idle cut was in flight"
        assert await entry_of(env, ino) is None and o.session_id

    env.run(go())


def test_an_idle_entry_left_to_its_writers_keeps_no_claim(env: Env) -> None:
    """Review (session 14): a cut that found the entry merged again (an idle trim, with a
    writer's session open by then) left it to the writers with its claim still on: every
    write open on another meta waited for a cut nobody was making, then EAGAIN, for claim_s."""
    from loomfs.meta.trim import must_settle, queue_trim
    from loomfs.wire.types import Layout as _Layout

    async def go() -> None:
        chunks = Chunks()
        a = _with_trimmer(env, chunks)
        b = _trimmer(env, chunks, wait_s=0.0)
        b.owner = 0x2222
        gate, started = asyncio.Event(), asyncio.Event()
        hold = False

        async def stripe_cutter(layout: _Layout, inode: int, length: int) -> None:
            if hold:
                started.set()
                await gate.wait()

        a.stripe_cutter = b.stripe_cutter = stripe_cutter
        await env.ns.set_layout("/", _Layout(chunk_size=MIB, table_id=1, ec_k=4, ec_m=2))
        stale = await env.ns.open("/f", CREAT, client_id=1)
        ino = stale.attr.inode
        await env.ns.sync(ino, 4000, trunc_epoch=stale.trunc_epoch)
        await env.ns.setattr("/f", size=100)
        hold = True
        closing = asyncio.ensure_future(env.ns.close(ino, stale.session_id, 8000, trunc_epoch=stale.trunc_epoch))
        await asyncio.wait_for(started.wait(), 5)
        now = env.clock.now_ns()
        async with env.store.write() as txn:  # meanwhile: a writer opens on meta B, and a
            await txn.add_session(ino, 777, 9, now)  # stale report merges another idle trim
            await queue_trim(txn, TrimEntry(inode=ino, layout=stale.attr.layout, length=100, old_length=9000,
                                            idle=True, generation=0, enqueued_ns=now), now)
        gate.set()
        await closing
        e = await entry_of(env, ino)
        assert e is not None and e.idle and e.claim_owner == 0
        async with env.store.read() as txn:
            assert not must_settle(e, await txn.session_count(ino), env.clock.now_ns())
        await b.settle(ino)  # answers at once: nobody is cutting

    env.run(go())


def test_a_conflict_while_settling_is_a_status_error(env: Env) -> None:
    """PostgreSQL hunt (session 14): a TxnConflict out of a settle (a claim lost to another
    meta) is not a StatusError, so an open or close that had committed skipped its cleanup
    (the open's session removal) and the caller's retry wrapper could not re-run it either."""
    from loomfs.meta.store.base import TxnConflict

    chunks = Chunks()
    t = _with_trimmer(env, chunks)
    ino = _file(env, chunks, "/c", 3000)

    async def lost(txn: object, inode: int) -> None:
        raise TxnConflict("serialisation conflict")

    t._claim = lost  # type: ignore[assignment,method-assign]
    with pytest.raises(StatusError) as e:
        env.run(t.settle(ino))
    assert e.value.errno == errno.EAGAIN
