"""The erasure-coded data path of an open file (``AsyncFile`` hands EC files' I/O here).

Writes are buffered one stripe at a time (k data fragments of ``chunk_size`` plus room for
the m parity fragments and the k+m headers, one pooled buffer); a stripe is sent when it is
full, when a write goes to another stripe, and at flush/fsync/close (the last partial stripe
is zero-padded). A write into a stripe that already had data first loads it (read-modify-
write) and is then written as an overwrite (staged in the shadow stripe first). Several
stripes are in flight at once, bounded by the client's write budget; writes of one stripe
keep their order. Reads: ``loomfs.client.ec_stripe.read_range``.
"""

from __future__ import annotations

import asyncio
import errno
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from loomfs.client.ec_io import FragmentIO
from loomfs.client.ec_stripe import (
    EcStats,
    StripeLost,
    payload,
    read_range,
    resolve,
    stripe_buffer_bytes,
    write_stripe,
)
from loomfs.client.storage_client import StorageClient, zero_fill
from loomfs.ec.codec import make_codec
from loomfs.errors import LoomError
from loomfs.net.buffers import Buffer, BufferPool
from loomfs.wire.types import Layout

if TYPE_CHECKING:
    from loomfs.client.file import AsyncFile

logger = logging.getLogger(__name__)

STATS = EcStats()  # process-wide counters (bench and tests read them)
# stripes of one file being written at once: enough to keep k+m servers busy, few enough that
# their buffers (k+m fragments each) come back to the pool instead of touching fresh memory
# (measured here, 128 MiB 4+2 writes: 4 at once 1.6-2.6x the replicated write, unbounded 1.2-1.6x)
INFLIGHT_STRIPES_MAX = 4


@dataclass
class _Pending:
    stripe: int
    buf: Buffer
    base_len: int  # the stripe's bytes before this buffer (loaded into it when > 0)
    lo: int  # written range in the stripe
    hi: int
    base_version: int = 0  # the loaded stripe's version: the one written is newer


class EcFileIO:
    verify = False

    def __init__(self, file: AsyncFile):
        storage = file._storage
        if not isinstance(storage, StorageClient):
            raise LoomError(f"{file.path}: erasure-coded files need the storage client", path=file.path)
        self.file = file
        self.io = FragmentIO(storage, file.layout, file.inode)
        self.geometry = self.io.geometry
        self.codec = make_codec(self.geometry.k, self.geometry.m)
        self._cur: _Pending | None = None
        self._last: dict[int, asyncio.Task[None]] = {}  # per stripe: keeps same-stripe order
        self._inflight = asyncio.Semaphore(max(1, INFLIGHT_STRIPES_MAX))
        # reads compare versions (``Layout.ec_reduced``: written with fragments skipped)
        self.verify = bool(file.layout.ec_reduced)

    @property
    def buffered(self) -> bool:
        return self._cur is not None

    async def write(self, pos: int, data: memoryview, file_len: int) -> None:
        """Buffer ``data`` at ``pos`` (``file_len``: the length before this write)."""
        g = self.geometry
        sb, cs = g.stripe_bytes, g.chunk_size
        done = 0
        while done < len(data):
            s, off = divmod(pos + done, sb)
            if self._cur is not None and self._cur.stripe != s:
                await self.dispatch()
            n = min(sb - off, len(data) - done)
            if self._cur is None:  # a write of the whole stripe needs none of its old bytes
                self._cur = await self._open_stripe(s, file_len, load=n < sb)
            cur = self._cur
            p = 0
            while p < n:  # copy into the data fragments' payloads
                j, foff = divmod(off + p, cs)
                take = min(cs - foff, n - p)
                payload(g, cur.buf, j)[foff : foff + take] = data[done + p : done + p + take]
                p += take
            if cur.lo == cur.hi:
                cur.lo, cur.hi = off, off + n
            else:
                cur.lo, cur.hi = min(cur.lo, off), max(cur.hi, off + n)
            done += n
            if cur.lo == 0 and cur.hi == sb:
                await self.dispatch()

    async def _open_stripe(self, s: int, file_len: int, *, load: bool = True) -> _Pending:
        g = self.geometry
        base_len = g.stripe_len(s, file_len)
        prev = self._last.get(s)
        if prev is not None and not prev.done():
            await asyncio.wait([prev])  # our own earlier write of this stripe lands first
        buf = self.file._pool.acquire(stripe_buffer_bytes(g))
        if base_len > 0 and load:  # read-modify-write: the stripe's current bytes first
            try:
                res = await resolve(self.io, self.codec, STATS, s, buf)
            except BaseException:
                self.file._pool.release(buf)
                raise
            if res is None:  # a hole: zeros
                for j in range(g.k):
                    zero_fill(payload(g, buf, j))
            else:
                base_len = max(base_len, res.stripe_len)
                return _Pending(s, buf, base_len, 0, 0, res.version)
        elif load:  # a new stripe, written in parts: what no write covers (a gap between two
            # writes) must read zeros, not what the pooled buffer held (review, session 13)
            for j in range(g.k):
                zero_fill(payload(g, buf, j))
        return _Pending(s, buf, base_len, 0, 0)

    async def dispatch(self) -> None:
        """Send the buffered stripe in the background (after waiting for write budget)."""
        cur, self._cur = self._cur, None
        if cur is None:
            return
        f = self.file
        if cur.lo == cur.hi and cur.base_len == 0:
            f._pool.release(cur.buf)
            return
        sb = self.geometry.stripe_bytes
        try:
            await self._inflight.acquire()
        except BaseException as exc:
            self._keep(cur, exc)
            raise
        try:
            await f._budget.acquire(sb)
        except BaseException as exc:
            self._inflight.release()
            self._keep(cur, exc)
            raise
        prev = self._last.get(cur.stripe)
        task = asyncio.get_running_loop().create_task(self._send(cur, prev))
        self._last[cur.stripe] = task
        f._flushes.add(task)
        task.add_done_callback(lambda t: self._sent(t, cur.stripe))

    def _keep(self, cur: _Pending, exc: BaseException) -> None:
        """``dispatch`` cancelled (or failed) while it waited for a slot or write budget: the
        stripe's buffer holds bytes of writes that returned, so it stays the file's current
        stripe, sent by the next flush or close; it was released to the pool, the bytes
        dropped with no error while the length counted them (session 16, as the chunk path's
        ``AsyncFile._dispatch``). Should another call have buffered meanwhile, those bytes are
        never claimed instead: the length stops before them and an EIO waits for fsync/close."""
        if self._cur is None:
            self._cur = cur
            return
        f = self.file
        at = cur.stripe * self.geometry.stripe_bytes
        f._note_failed(at + cur.lo, at + cur.hi, exc)
        if f._error is None:
            f._error = LoomError(f"write of stripe {cur.stripe} abandoned: {exc!r}", errno=errno.EIO, path=f.path)
        f._pool.release(cur.buf)

    async def _send(self, cur: _Pending, prev: asyncio.Task[None] | None) -> None:
        f = self.file
        try:
            if prev is not None and not prev.done():
                await asyncio.wait([prev])
            stripe_len = max(cur.base_len, cur.hi)
            valid_lo, valid_hi = (0, stripe_len) if cur.base_len else (cur.lo, cur.hi)
            # a partial stripe's fragments are shorter than a full one's: cut each chunk to its
            # length, so no longer leftover (an unacknowledged earlier write) trails its header
            await write_stripe(self.io, self.codec, STATS, cur.stripe, cur.buf, stripe_len,
                               valid_lo=valid_lo, valid_hi=valid_hi, overwrite=cur.base_len > 0,
                               exact=stripe_len < self.geometry.stripe_bytes,
                               ack_min=f._config.ec_ack_fragments_min, above_version=cur.base_version,
                               mark_reduced=self._mark_reduced)
        except Exception as exc:
            logger.warning("%s: write of stripe %d failed: %s", f.path, cur.stripe, exc)
            if f._error is None:
                f._error = exc
            # the length reported to meta stops before it, and fsync/close fail, until the
            # range is written again, as for a failed chunk write (AsyncFile._note_failed)
            at = cur.stripe * self.geometry.stripe_bytes
            f._note_failed(at + cur.lo, at + cur.hi, exc)
        else:
            at = cur.stripe * self.geometry.stripe_bytes
            f._note_written(at + cur.lo, at + cur.hi)  # a failure there before is written over
        finally:
            f._pool.release(cur.buf)
            f._budget.release(self.geometry.stripe_bytes)
            self._inflight.release()

    def _sent(self, task: asyncio.Task[None], stripe: int) -> None:
        self.file._flushes.discard(task)
        if self._last.get(stripe) is task:
            del self._last[stripe]

    async def _mark_reduced(self) -> None:
        """Around each stripe written without some fragments: mark the file in meta
        (``Layout.ec_reduced``, a new generation), so readers compare versions until a scrub
        repaired it (``write_stripe``); a failed mark fails the stripe write."""
        f = self.file
        await f._meta.sync(f.inode, -1, trunc_epoch=f._trunc_epoch, session_id=f.session_id, ec_reduced=True)
        self.verify = True

    async def read_into(self, pos: int, view: memoryview) -> None:
        await read_range(self.io, self.codec, STATS, self.file._pool, pos, view,
                         parallel_max=max(1, self.file._config.parallel_chunks_max), verify=self.verify)

    def __repr__(self) -> str:
        return f"EcFileIO({self.io!r} codec={self.codec.name} buffered={self.buffered})"


async def cut_last_stripe(storage: StorageClient, layout: Layout, inode: int, size: int) -> None:
    """Meta's trim of an EC file to ``size`` (``loomfs.meta.trim``; the whole stripes past it
    are removed there): re-encode the stripe holding the new end without the bytes past it, so
    an extend afterwards reads zeros there. Nothing to do at a stripe boundary, for a hole, or
    for a stripe that already ends at or before ``size``. Every fragment (and the shadow) is
    read, and the newest version decoded, as a scrub does. Fragments unreachable now: raises
    (the trim is retried). A stripe lost for good (every fragment answered, no version has k
    good ones) is left as it is: it reads EIO before the cut and after it, as it did, and the
    file's writers are not held up by a re-encode that cannot succeed (review, session 14)."""
    await reencode_end(FragmentIO(storage, layout, inode), size)


async def reencode_end(io: FragmentIO, size: int) -> None:
    """``cut_last_stripe`` on the fragments of ``io``."""
    g, inode = io.geometry, io.inode
    s, rem = divmod(size, g.stripe_bytes)
    if rem == 0:
        return
    buf = bytearray(stripe_buffer_bytes(g))
    try:
        res = await resolve(io, make_codec(g.k, g.m), STATS, s, buf, repair=False, full=True)
    except StripeLost as exc:
        logger.error("inode %d: truncate to %d leaves stripe %d as it is (lost): %s", inode, size, s, exc)
        return
    if res is None or res.stripe_len <= rem:
        return
    await write_stripe(io, make_codec(g.k, g.m), STATS, s, buf, rem, valid_lo=0, valid_hi=rem,
                       overwrite=True, exact=True, above_version=res.version)


async def read_ec(storage: StorageClient, layout: Layout, inode: int, pos: int, view: memoryview,
                  pool: BufferPool, *, parallel_max: int = 16) -> None:
    """Read an EC file's bytes at ``pos`` into ``view`` without an open file (batch reads)."""
    io = FragmentIO(storage, layout, inode)
    codec = make_codec(io.geometry.k, io.geometry.m)
    await read_range(io, codec, STATS, pool, pos, view, parallel_max=parallel_max, verify=bool(layout.ec_reduced))
