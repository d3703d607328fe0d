"""Crash-safe truncates: the trim queue, and the worker that cuts chunks for it.

A *shrink* commits, in one meta transaction, the new length, a new *truncate epoch* of the
file and a durable trim entry (``TrimEntry``: inode, layout, new length, old length). Shrinks
are SETATTR to a smaller size and O_TRUNC of a non-empty file, and also any size set (O_TRUNC
included) while the file has write sessions: their writers may have written past the length
they reported. The chunks are cut afterwards by a ``Trimmer``: it truncates the chunk holding
the new end (unless the end is on a chunk boundary) and removes every chunk past it, through
the storage calls GC uses. A cut is idempotent: an entry is cut again until a cut succeeds,
then deleted. Clients never cut chunks.

Rule 1, a trim runs before any later write can land past its length. A trim removes only
bytes at and past its ``length``. A write that should survive it is one ordered after the
truncate, and a writer learns it may write (its session, or the current epoch) only from a
reply of meta: write OPEN, SETATTR of the size (also an extend, which exposes bytes past the
end), SYNC and CLOSE, and for a writer of an inline file WRITE_INLINE that finds the file in
chunks and MIGRATE. Each of these *settles* the file before it answers: cuts the file's
pending truncate trim, or waits for the performer that holds it. So:

* the truncating call answers after its own cut: writes its caller sends afterwards are safe;
* a crash between the commit and the cut leaves the entry; the next of those calls on the
  file cuts it before answering, and the GC worker cuts it when nobody calls. "Truncate to
  0, crash, write the file again" cuts the old chunks before the first new byte is sent, so
  a later extend or sparse write reads zeros, not old bytes, and the late trim never cuts
  new data;
* writers that opened before the truncate and have not heard of it (stale) may land bytes
  before or after the cut; they are ordered before the truncate (rule 2).

Performers are serialised per inode: in one meta process by one task per inode, across meta
processes by a claim in the entry (owner, expiry) taken in a transaction; a shrink's own
transaction claims its entry for the settle that follows. A claim that ran out (a meta died
mid-cut) may be taken over. It lasts ``claim_s``, longer than a cut may take
(``cut_timeout_s``) plus the deadline of a storage request already sent, so a storage update
of the old performer cannot land after the new one finished and a write followed. A cut
that failed waits for all its calls and backs off ``retry_s``; one that hung fences the
entry for ``claim_s``. A shrink merges into a pending entry (lowest length, or the shrink's
over an idle one; highest old length, generation + 1) and keeps a live claim: the holder sees
the generation change and cuts again.

Rule 2, stale lengths never grow back past a truncate. Writers send the truncate epoch they
know with their length reports (SYNC, CLOSE); meta answers with the current one. A report at
the current epoch sets the length to max(current, reported), as before. A report at an older
epoch comes from a writer that has not seen the last truncate: its extent may include bytes
written before it, so the report never grows the length, and whatever it wrote past the
current length is treated as written before the truncate and cut: meta queues an *idle*
trim, cut at the file's length then, once no write session is open (an open writer may be
writing there and will report; a fresh writer's bytes are below the length by then). The
writer learns the new epoch from that reply and counts only bytes written after it: for a
writer, a truncate by someone else takes effect when it next reports (fsync/close), the
points where LoomFS lengths are exact anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Protocol

from loomfs.common.clock import SYSTEM_CLOCK, Clock
from loomfs.ec.stripe import SHADOW_STRIPE_BASE, Geometry
from loomfs.errors import LoomError, StatusError
from loomfs.meta.store.base import MetaStore, MetaTxn, TrimEntry, TxnConflict
from loomfs.wire.status import Status
from loomfs.wire.types import FileType, Layout

logger = logging.getLogger(__name__)

CLAIM_S = 60.0  # a performer's claim; > CUT_TIMEOUT_S + a storage request's deadline
CUT_TIMEOUT_S = 20.0  # one cut (its storage calls) gives up after this
TRIM_CALL_TIMEOUT_S = 20.0  # deadline of the trimming storage client's calls (server.py)
WAIT_S = 8.0  # a call waits this long for another meta's claim before answering EAGAIN
POLL_S = 0.05
RETRY_S = 5.0  # after a failed cut the GC worker tries again this much later

_FILE = int(FileType.FILE)
INDEX_END = 1 << 62  # past any chunk index


class ChunkCutter(Protocol):
    """The storage calls a trim needs (``loomfs.client.storage_client.StorageClient`` fits)."""

    async def truncate_chunk(self, layout: Layout, inode: int, index: int, length: int, *,
                             fenced: bool = False) -> None: ...

    async def remove_chunks(self, layout: Layout, inode: int, index_begin: int, index_end: int = INDEX_END, *,
                            keep_versions: bool = False, fenced: bool = False) -> None: ...


def merge(cur: TrimEntry | None, new: TrimEntry, now_ns: int) -> TrimEntry:
    """``new`` queued where ``cur`` may already be: one entry that cuts what both cut.

    Lowest length and highest old length; idle only if both are; a live claim of ``cur`` is
    kept (its holder cuts again when it sees the generation change), and so is a back-off.

    A shrink (not idle) merged into an idle entry cuts at the shrink's length, also when the
    idle entry's is lower: the idle cut falls at ``max(its length, the file's length)``, and
    the shrink has just set the file's length to its own, so the idle cut would fall there
    too. The idle entry's length is only the file's length when its stale report came; a
    current writer may have written past it since (unreported, still open), and a size set
    under it (an extend, for meta) keeps those bytes below the new size (hunt 16: the merge
    took the lowest length and cut them). The stale writer's bytes below the shrink's length
    then read as data, not zeros, as they would have at the idle cut: the known gap of idle
    trims (docs/fault-tolerance.md, "truncates are crash-safe"); never a live writer's bytes
    lost for it."""
    if cur is None:
        return dataclasses.replace(new, generation=1)
    owner, until = new.claim_owner, new.claim_until_ns
    if cur.claim_until_ns > now_ns:
        owner, until = cur.claim_owner, cur.claim_until_ns
    length = new.length if cur.idle and not new.idle else min(cur.length, new.length)
    return TrimEntry(
        inode=cur.inode, layout=cur.layout, length=length,
        old_length=max(cur.old_length, new.old_length), idle=cur.idle and new.idle,
        generation=cur.generation + 1, enqueued_ns=cur.enqueued_ns, claim_owner=owner,
        claim_until_ns=until,
    )


async def queue_trim(txn: MetaTxn, entry: TrimEntry, now_ns: int) -> TrimEntry:
    """Merge ``entry`` into the inode's pending trim inside the caller's transaction."""
    merged = merge(await txn.trim_get(entry.inode), entry, now_ns)
    await txn.trim_put(merged)
    return merged


def must_settle(entry: TrimEntry | None, sessions: int, now_ns: int = 0) -> bool:
    """Whether a call that lets writes land past the length must settle ``entry`` first:
    truncate trims always; idle ones when no write session is open (they are cut then), or
    when a performer is cutting one now (claimed before this caller's session was counted:
    its cut, an EC stripe's re-encode included, must not race the writes this call allows)."""
    if entry is None:
        return False
    if not entry.idle or sessions == 0:
        return True
    return entry.claim_owner != 0 and entry.claim_until_ns > now_ns


# re-encodes an EC file's stripe holding a new end (layout, inode, length): ``loomfs.client.ec_file.cut_last_stripe``
StripeCutter = Callable[[Layout, int, int], Awaitable[None]]


class _Busy:
    pass


_BUSY = _Busy()


class Trimmer:
    """Cuts the chunks of pending trims, one task per inode (see the module docstring)."""

    def __init__(
        self,
        store: MetaStore,
        cutter: ChunkCutter,
        *,
        clock: Clock = SYSTEM_CLOCK,
        owner: int = 0,
        claim_s: float = CLAIM_S,
        cut_timeout_s: float = CUT_TIMEOUT_S,
        wait_s: float = WAIT_S,
        retry_s: float = RETRY_S,
        stripe_cutter: StripeCutter | None = None,
    ):
        self.store = store
        self.cutter = cutter
        self.stripe_cutter = stripe_cutter
        self.clock = clock
        self.owner = owner or (random.SystemRandom().getrandbits(62) | 1)  # fresh per process
        self.claim_s = claim_s
        self.cut_timeout_s = cut_timeout_s
        self.wait_s = wait_s
        self.retry_s = retry_s
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self.trims_total = 0
        self.failures_total = 0

    def claim(self, now_ns: int) -> tuple[int, int]:
        """(owner, until) for an entry the caller will settle right after its commit."""
        return self.owner, now_ns + int(self.claim_s * 1e9)

    async def settle(self, inode: int) -> None:
        """Return once ``inode`` has no pending trim that may run now: cut it here, or wait
        for the task of this process that is cutting it. Raises ``StatusError`` (EAGAIN:
        another meta holds it; EIO: the cut failed; the entry stays queued either way)."""
        prior = self._tasks.get(inode)
        if prior is not None:  # it may have read the entry before our caller's commit
            with contextlib.suppress(Exception):
                await asyncio.shield(prior)
        task = self._tasks.get(inode)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._settle(inode), name=f"trim-{inode}")
            self._tasks[inode] = task
            task.add_done_callback(lambda t: self._forget(inode, t))
        try:
            await asyncio.shield(task)  # a caller that goes away does not stop a cut half-way
        except TxnConflict as exc:
            # a claim or release lost to another meta (PostgreSQL): the entry stays queued. As a
            # StatusError, so the caller (an open, a close) runs its cleanup as for any failed
            # settle; the operation it settles for was committed and must not be re-run
            raise StatusError(Status.EAGAIN, f"inode {inode}: trim pending: {exc}") from exc

    def _forget(self, inode: int, task: asyncio.Task[None]) -> None:
        if self._tasks.get(inode) is task:
            del self._tasks[inode]
        if not task.cancelled():
            task.exception()  # retrieved: the callers got it

    async def _settle(self, inode: int) -> None:
        deadline = self.clock.monotonic() + self.wait_s
        while True:
            async with self.store.write() as txn:
                step = await self._claim(txn, inode)
            if step is None:
                return
            if isinstance(step, _Busy):
                if self.clock.monotonic() >= deadline:
                    raise StatusError(Status.EAGAIN, f"inode {inode}: another meta is trimming it")
                await asyncio.sleep(POLL_S)
                continue
            entry, cut_at = step
            cut = asyncio.ensure_future(self._cut(entry.layout, inode, cut_at))
            done, _ = await asyncio.wait({cut}, timeout=self.cut_timeout_s)
            exc = cut.exception() if done else None
            if not done or exc is not None:
                cut.cancel()
                self.failures_total += 1
                why = exc or f"no answer in {self.cut_timeout_s:.0f}s"
                logger.warning("trim: cutting inode %d at %d failed: %s", inode, cut_at, why)
                # a cut that failed has no call in flight: try again after a back-off; one
                # that hung may have: nobody cuts until a claim's time has passed
                await self._release(inode, self.retry_s if done else self.claim_s)
                # a fenced cut that kept finding fresh writes on the chunks (a writer still at it):
                # busy, not broken
                busy = isinstance(exc, LoomError) and exc.status is Status.VERSION_MISMATCH
                raise StatusError(Status.EAGAIN if busy else Status.EIO,
                                  f"inode {inode}: trim to {cut_at} pending: {why}") from exc
            async with self.store.write() as txn:
                cur = await txn.trim_get(inode)
                if cur is not None and cur.generation == entry.generation:
                    await txn.trim_delete(inode)
                    cur = None
            if cur is None:
                self.trims_total += 1
                logger.debug("trim: inode %d cut at %d (was %d)", inode, cut_at, entry.old_length)
                return
            # a shrink merged in while we cut: cut again (we still hold the claim)

    async def _claim(self, txn: MetaTxn, inode: int) -> tuple[TrimEntry, int] | _Busy | None:
        """Claim the inode's entry if it may be cut now; returns it with the cut length."""
        e = await txn.trim_get(inode)
        if e is None:
            return None
        attr = await txn.get_inode(inode)
        if attr is None or attr.type != _FILE:
            await txn.trim_delete(inode)  # unlinked: GC removes every chunk (it waited for us)
            return None
        now = self.clock.now_ns()
        if e.idle and await txn.has_session(inode):
            if e.claim_owner not in (0, self.owner) and e.claim_until_ns > now:
                return _BUSY  # another meta is cutting it: a writer that opened meanwhile waits
            if e.claim_owner == self.owner:  # ours, from a cut that just ended: no longer cutting
                await txn.trim_put(dataclasses.replace(e, claim_owner=0, claim_until_ns=0))
            return None  # cut once the writers are gone
        if e.claim_owner != self.owner and e.claim_until_ns > now:
            return _BUSY  # another meta's claim, or a back-off
        cut_at = max(e.length, attr.size) if e.idle else e.length
        owner, until = self.claim(now)
        await txn.trim_put(dataclasses.replace(e, claim_owner=owner, claim_until_ns=until))
        return e, cut_at

    async def _release(self, inode: int, hold_s: float) -> None:
        """After a failed cut: drop our claim; nobody cuts for ``hold_s`` (a back-off)."""
        with contextlib.suppress(Exception):
            async with self.store.write() as txn:
                cur = await txn.trim_get(inode)
                if cur is not None and cur.claim_owner == self.owner:
                    until = self.clock.now_ns() + int(hold_s * 1e9)
                    await txn.trim_put(dataclasses.replace(cur, claim_owner=0, claim_until_ns=until))

    async def _cut(self, layout: Layout, inode: int, length: int) -> None:
        if not layout.chains:
            return
        if layout.ec_k > 0:
            await self._cut_ec(layout, inode, length)
            return
        cs = layout.chunk_size
        # keep_versions: the file lives on, and a chunk that grows again must continue its
        # version numbers (a replica that missed the trim then gets the whole chunk)
        # fenced: each chunk is cut only if nobody wrote it after the cut looked at it, so a
        # copy of this cut that reaches storage late (a held connection, a hung head), after
        # another meta took the claim over, cut the file and a write followed, cuts nothing
        calls = [self.cutter.remove_chunks(layout, inode, -(-length // cs), keep_versions=True, fenced=True)]
        if length % cs:
            calls.append(self.cutter.truncate_chunk(layout, inode, length // cs, length % cs, fenced=True))
        # wait for every call (each bounded by the storage client's deadline) before raising,
        # so a failed cut leaves no call of ours in flight
        for r in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(r, BaseException):
                raise r

    async def _cut_ec(self, layout: Layout, inode: int, length: int) -> None:
        """An erasure-coded file (docs/ec.md): fragment j of stripe s is chunk s*(k+m) + slot,
        so the cut removes whole stripes past the end, and the shadow copies of those stripes
        (an overwrite in flight), then re-encodes the stripe holding the new end without the
        bytes past it (``stripe_cutter``), so an extend afterwards reads zeros there."""
        g = Geometry(layout.ec_k, layout.ec_m, layout.chunk_size)
        first = g.stripes(length)
        calls = [
            self.cutter.remove_chunks(layout, inode, first * g.width, SHADOW_STRIPE_BASE * g.width,
                                      keep_versions=True, fenced=True),
            self.cutter.remove_chunks(layout, inode, (SHADOW_STRIPE_BASE + first) * g.width,
                                      keep_versions=True, fenced=True),
        ]
        for r in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(r, BaseException):
                raise r
        if length % g.stripe_bytes:
            if self.stripe_cutter is None:
                raise StatusError(Status.EIO, f"inode {inode}: no stripe cutter to re-encode the end of an EC file")
            await self.stripe_cutter(layout, inode, length)

    def __repr__(self) -> str:
        return (f"Trimmer(owner={self.owner:#x} trims={self.trims_total} failures={self.failures_total} "
                f"running={len(self._tasks)})")
