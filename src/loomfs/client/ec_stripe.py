"""Stripe reads and writes of an erasure-coded file (see docs/ec.md and ``loomfs.ec.stripe``).

A stripe buffer holds all k+m fragment chunks of one stripe, each as it goes to storage:
``[payload: up to chunk_size bytes][64-byte header]``, fragment j's slot at ``j * (cs + 64)``
(the header trails the payload, so payload offsets stay aligned for the servers' O_DIRECT
reads and block CRCs).

* ``write_stripe`` pads, encodes, stamps a new version and CRC32C into every header and writes
  the k+m fragments in parallel. An overwrite of a stripe that had data is staged first: the
  whole new stripe goes to the shadow chunks, then in place, then the shadow is removed, so at
  every moment one complete version of the stripe exists (in place, or in the shadow).
* ``read_range`` reads a healthy stripe's data fragments straight into the caller's buffer;
  a fragment that fails (dead server, bad CRC on disk, missing) makes that stripe degraded:
  ``resolve`` reads k fragments (all k+m, and the shadow, when those k do not agree), keeps
  those whose header and CRC32C check out, groups them by version and decodes the newest
  version that has k of them. Two versions are never combined. Fragments found bad while
  their server is up are rewritten (repaired) with the decoded version.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from loomfs.client.ec_io import FragmentIO, FragmentUnavailable
from loomfs.client.storage_client import zero_fill
from loomfs.ec.codec import Codec
from loomfs.ec.stripe import (
    HEADER_BYTES,
    FragmentHeader,
    FragPiece,
    Geometry,
    payload_crc,
    split_range,
)
from loomfs.errors import LoomError
from loomfs.net.buffers import Buffer, BufferPool
from loomfs.wire.status import Status

logger = logging.getLogger(__name__)

ENCODE_IN_THREAD_BYTES = 1 << 20
_version_lock = threading.Lock()
_last_version = 0


def next_version() -> int:
    """A stripe version: wall-clock ns, strictly increasing in this process."""
    global _last_version
    with _version_lock:
        _last_version = max(time.time_ns(), _last_version + 1)
        return _last_version


def slot_bytes(g: Geometry) -> int:
    return HEADER_BYTES + g.chunk_size


def stripe_buffer_bytes(g: Geometry) -> int:
    return g.width * slot_bytes(g)


def payload(g: Geometry, buf: Buffer, fragment: int, length: int | None = None) -> memoryview:
    start = fragment * slot_bytes(g)
    return memoryview(buf)[start : start + (g.chunk_size if length is None else length)]


def chunk_view(g: Geometry, buf: Buffer, fragment: int, payload_len: int) -> memoryview:
    start = fragment * slot_bytes(g)
    return memoryview(buf)[start : start + payload_len + HEADER_BYTES]


@dataclass
class Resolved:
    """A stripe decoded from one version: every data fragment's payload is in the buffer
    (zero-padded to the parity length)."""

    stripe_len: int
    version: int
    from_shadow: bool
    bad: list[int] = field(default_factory=list)  # reachable fragments that need rewriting (in place)
    unreachable: list[int] = field(default_factory=list)  # fragments whose server did not answer
    # bad fragment -> what it held in place when the decode read it (its header, BAD or ABSENT):
    # a repair rewrites it only if it still holds that (else someone wrote it since)
    was: dict[int, FragmentHeader | str] = field(default_factory=dict)


class StripeLost(LoomError):
    """Every fragment of the stripe answered and no version has k good ones: lost for good
    (unlike fragments that are only unreachable now)."""


@dataclass
class EcStats:
    degraded_stripes_total: int = 0
    repaired_fragments_total: int = 0
    shadow_writes_total: int = 0
    reduced_stripes_total: int = 0  # written with fewer than k+m fragments (ec_ack_fragments_min)


def _zero_gaps(g: Geometry, buf: Buffer, valid_lo: int, valid_hi: int, plen: int) -> None:
    """Zero every data fragment's payload in [0, plen) outside stripe bytes [valid_lo, valid_hi)."""
    cs = g.chunk_size
    for j in range(g.k):
        lo = min(max(valid_lo - j * cs, 0), plen)
        hi = min(max(valid_hi - j * cs, 0), plen)
        view = payload(g, buf, j, plen)
        if lo > 0:
            zero_fill(view[:lo])
        if hi < plen:
            zero_fill(view[max(hi, lo) :])


async def write_stripe(io: FragmentIO, codec: Codec, stats: EcStats, stripe: int, buf: Buffer,
                       stripe_len: int, *, valid_lo: int, valid_hi: int, overwrite: bool,
                       exact: bool = False, ack_min: int = 0, above_version: int = 0,
                       mark_reduced: Callable[[], Awaitable[None]] | None = None) -> int:
    """Encode and write one stripe from ``buf`` (data payloads hold stripe bytes
    [valid_lo, valid_hi), the rest is zero-filled). Returns the version written.
    ``ack_min`` (k+1..k+m-1, opt-in): fragments whose chain routing shows down are skipped
    when at least that many remain; 0: all k+m (wait for the routing to heal, or fail).
    ``mark_reduced``: awaited before and after a stripe is written without some fragments:
    the file is marked in meta (``Layout.ec_reduced``, a new generation each time), so reads
    compare versions (a skipped fragment's server may come back with the old bytes), and a
    scrub that read this stripe before the write landed cannot clear the mark (its
    generation moved after the write).
    ``above_version``: the version written is newer than this one (one another process's
    clock stamped), so a read never prefers the stripe's old version to the new one."""
    g = io.geometry
    plen = g.parity_len(stripe_len)
    _zero_gaps(g, buf, valid_lo, valid_hi, plen)
    data = [payload(g, buf, j, plen) for j in range(g.k)]
    parity = [payload(g, buf, j, plen) for j in range(g.k, g.width)]
    if plen >= ENCODE_IN_THREAD_BYTES:  # ctypes drops the GIL: encode beside the network I/O
        await asyncio.to_thread(codec.encode, data, parity)
    else:
        codec.encode(data, parity)
    version = max(next_version(), above_version + 1)
    stamp(g, buf, stripe, stripe_len, version)
    frags: list[int] | None = None
    if g.k < ack_min < g.width:
        up = [j for j in range(g.width) if not io.down(g.chunk_index(stripe, j))]
        if ack_min <= len(up) < g.width:
            if mark_reduced is not None:
                await mark_reduced()
            frags = up
            stats.reduced_stripes_total += 1
            logger.warning("inode %d stripe %d: written with %d of %d fragments (ec_ack_fragments_min=%d); "
                           "`loomfs layout scrub --repair` restores it", io.inode, stripe, len(up), g.width, ack_min)
    if overwrite:
        stats.shadow_writes_total += 1
        await write_fragments(io, buf, stripe, stripe_len, shadow=True, exact=exact, fragments=frags)
    await write_fragments(io, buf, stripe, stripe_len, shadow=False, exact=exact, fragments=frags)
    if overwrite and frags is None:
        shadow = g.stripe_chunks(stripe, shadow=True)
        await io.remove_all(shadow.start, shadow.stop)
    elif overwrite and frags is not None:  # the skipped fragments' servers are down: their
        # shadow chunks are left (never written by this overwrite; an older leftover there is
        # older than the stripe, and a shadow no newer than the stripe in place is never used)
        await _remove_each(io, [g.chunk_index(stripe, j, shadow=True) for j in frags])
    if frags is not None and mark_reduced is not None:
        await mark_reduced()
    return version


async def _remove_each(io: FragmentIO, indexes: Sequence[int]) -> None:
    got = await asyncio.gather(*(io.remove_one(i) for i in indexes), return_exceptions=True)
    for r in got:
        if isinstance(r, BaseException):
            raise r


def stamp(g: Geometry, buf: Buffer, stripe: int, stripe_len: int, version: int,
          fragments: Sequence[int] | None = None) -> None:
    for j in range(g.width) if fragments is None else fragments:
        n = g.payload_len(stripe_len, j)
        h = FragmentHeader(g.k, g.m, j, stripe, version, stripe_len, n, payload_crc(payload(g, buf, j, n)))
        start = j * slot_bytes(g) + n
        memoryview(buf)[start : start + HEADER_BYTES] = h.pack()


async def write_fragments(io: FragmentIO, buf: Buffer, stripe: int, stripe_len: int, *, shadow: bool,
                          fragments: Sequence[int] | None = None, exact: bool = False) -> None:
    """Write the fragments in parallel; raises (the first error) only once every call ended,
    so a failed stripe write leaves no fragment write of its own in flight (a trim's re-encode
    relies on it: its entry's back-off assumes no call of it can land later)."""
    g = io.geometry
    frags = range(g.width) if fragments is None else fragments
    got = await asyncio.gather(*(io.write(g.chunk_index(stripe, j, shadow=shadow),
                                          chunk_view(g, buf, j, g.payload_len(stripe_len, j)), exact=exact)
                                 for j in frags), return_exceptions=True)
    for r in got:
        if isinstance(r, BaseException):
            raise r


ABSENT = "absent"  # the chunk does not exist
BAD = "bad"  # it exists (or its server is up) but fails its header or CRC32C check


async def _read_one(io: FragmentIO, view: memoryview, stripe: int, j: int, *,
                    shadow: bool) -> FragmentHeader | str | None:
    """Read fragment ``j`` whole into ``view`` (one slot): its header if it checks out (CRC32C
    included), else ABSENT or BAD; None if unreachable."""
    g = io.geometry
    try:
        n = await io.read(g.chunk_index(stripe, j, shadow=shadow), 0, len(view), view)
    except FragmentUnavailable as exc:
        logger.debug("stripe %d fragment %d: %s", stripe, j, exc)
        return BAD if exc.corrupt else None
    if n is None or n == 0:  # never written, or emptied (a trim, a used shadow): no fragment
        return ABSENT
    h = FragmentHeader.unpack(view[n - HEADER_BYTES : n]) if HEADER_BYTES <= n <= len(view) else None
    if (h is not None and h.fragment == j and h.stripe == stripe and (h.k, h.m) == (g.k, g.m)
            and h.payload_len == g.payload_len(h.stripe_len, j) == n - HEADER_BYTES
            and payload_crc(view[: h.payload_len]) == h.crc):
        return h
    logger.warning("inode %d stripe %d fragment %d: bad header or CRC32C", io.inode, stripe, j)
    return BAD


async def _read_whole(io: FragmentIO, buf: Buffer, stripe: int, fragments: Sequence[int], *,
                      shadow: bool) -> dict[int, FragmentHeader | str]:
    """Read fragments whole into their slots (``_read_one``). Unreachable ones are left out."""
    g = io.geometry

    async def one(j: int) -> tuple[int, FragmentHeader | str | None]:
        view = memoryview(buf)[j * slot_bytes(g) : (j + 1) * slot_bytes(g)]
        return j, await _read_one(io, view, stripe, j, shadow=shadow)

    got = await asyncio.gather(*(one(j) for j in fragments))
    return {j: r for j, r in got if r is not None}


def _best(g: Geometry, found: dict[int, FragmentHeader | str]) -> tuple[int, int] | None:
    groups: dict[tuple[int, int], int] = {}
    for h in found.values():
        if isinstance(h, FragmentHeader):
            groups[h.key()] = groups.get(h.key(), 0) + 1
    usable = [key for key, n in groups.items() if n >= g.k]
    return max(usable) if usable else None


def _count(found: dict[int, FragmentHeader | str], key: tuple[int, int]) -> int:
    return sum(1 for h in found.values() if isinstance(h, FragmentHeader) and h.key() == key)


async def resolve(io: FragmentIO, codec: Codec, stats: EcStats, stripe: int, buf: Buffer,
                  *, repair: bool = True, full: bool = False) -> Resolved | None:
    """Decode stripe ``stripe`` into ``buf`` (every data fragment's payload) from k fragments
    of one version. First (unless ``full``) k fragments are read, data first, skipping chains
    known to be down: if all k are good and of one version, that version is decoded. Else
    (and with ``full``: scrubs) every fragment is read and the newest version with k good
    fragments is decoded, the shadow stripe included. None if no fragment of the stripe exists
    (a hole). EIO if no version has k good fragments: never a mix of two versions."""
    g = io.geometry
    stats.degraded_stripes_total += 1
    if not full:
        up = [j for j in range(g.width) if not io.down(g.chunk_index(stripe, j))]
        if len(up) >= g.k:
            found = await _read_whole(io, buf, stripe, up[: g.k], shadow=False)
            key = _best(g, found)
            if key is not None:
                return _decoded(io, codec, stats, stripe, buf, found, key, from_shadow=False, repair=repair,
                                unread=[j for j in range(g.width) if j not in up[: g.k]])
    found = await _read_whole(io, buf, stripe, range(g.width), shadow=False)
    in_place = found
    key = _best(g, found)
    from_shadow = False
    shadow: dict[int, FragmentHeader | str] = {}
    if key is None or _count(found, key) < g.width:
        # an overwrite may have been cut short: its complete new version waits in the shadow
        sbuf = bytearray(stripe_buffer_bytes(g))
        shadow = await _read_whole(io, sbuf, stripe, range(g.width), shadow=True)
        skey = _best(g, shadow)
        if skey is not None and (key is None or skey > key):
            key, found, from_shadow = skey, shadow, True
            memoryview(buf)[: len(sbuf)] = sbuf
    if key is None:
        absent = sum(1 for h in found.values() if h == ABSENT)
        if absent == len(found) and absent >= g.k:
            return None  # never written (a written stripe would have k of these)
        # lost for good only if every fragment answered, in place and in the shadow
        err = StripeLost if len(found) == len(shadow) == g.width else LoomError
        raise err(f"inode {io.inode} stripe {stripe}: fewer than {g.k} consistent fragments "
                  f"({len(found)} of {g.width} reachable)")
    return _decoded(io, codec, stats, stripe, buf, found, key, from_shadow=from_shadow, repair=repair, unread=[],
                    in_place=in_place)


def _decoded(io: FragmentIO, codec: Codec, stats: EcStats, stripe: int, buf: Buffer,
             found: dict[int, FragmentHeader | str], key: tuple[int, int], *, from_shadow: bool,
             repair: bool, unread: list[int],
             in_place: dict[int, FragmentHeader | str] | None = None) -> Resolved:
    """Decode what ``buf`` lacks of version ``key`` (``unread`` fragments were not asked for:
    only the data ones among them are decoded) and start the repair of bad fragments
    (``in_place``: what the in-place fragments held when ``found`` is the shadow's)."""
    g = io.geometry
    version, stripe_len = key
    good = [j for j, h in found.items() if isinstance(h, FragmentHeader) and h.key() == key]
    missing = [j for j in range(g.width) if j not in good and (j < g.k or j not in unread)]
    plen = g.parity_len(stripe_len)
    for j in good:  # data payloads shorter than the parity length are zeros beyond
        n = g.payload_len(stripe_len, j)
        if n < plen:
            zero_fill(payload(g, buf, j, plen)[n:])
    if missing and plen:
        codec.decode({j: payload(g, buf, j, plen) for j in good[: g.k]},
                     {j: payload(g, buf, j, plen) for j in missing})
    for j in range(g.k):  # past its bytes a data fragment is zeros (not a trailer or stale bytes)
        n = g.payload_len(stripe_len, j)
        if n < g.chunk_size:
            zero_fill(payload(g, buf, j)[n:])
    bad = [j for j in missing if j in found]  # answered, but absent, corrupt or of another version
    unreachable = [j for j in range(g.width) if j not in found and j not in unread]
    if from_shadow and in_place is not None:  # every in-place fragment that answered and lacks it
        bad = [j for j, h in sorted(in_place.items()) if not (isinstance(h, FragmentHeader) and h.key() == key)]
        unreachable = sorted(set(unreachable) | {j for j in range(g.width) if j not in in_place})
    was = in_place if from_shadow and in_place is not None else found
    res = Resolved(stripe_len, version, from_shadow, bad, unreachable, {j: was[j] for j in bad if j in was})
    if repair and (bad or from_shadow):
        copy = bytearray(stripe_buffer_bytes(g))  # the caller reuses ``buf``
        copy[:] = memoryview(buf)[: len(copy)]
        task = asyncio.get_running_loop().create_task(repair_fragments(io, stats, stripe, copy, res))
        _REPAIRS.add(task)
        task.add_done_callback(_REPAIRS.discard)
    return res


_REPAIRS: set[asyncio.Task[list[int]]] = set()  # repairs run in the background of the read that found them


async def repairs_settled() -> None:
    """Wait for the repairs this event loop started so far (tests, bench, close). Repairs of
    another loop cannot be awaited here; those of a loop closed since (a client closed while
    its repair was pending) never end and are dropped: gathering one raised RuntimeError
    ("attached to a different loop") in whichever test or client asked next."""
    loop = asyncio.get_running_loop()
    while True:
        for t in [t for t in _REPAIRS if t.get_loop() is not loop and t.get_loop().is_closed()]:
            _REPAIRS.discard(t)
        mine = [t for t in _REPAIRS if t.get_loop() is loop]
        if not mine:
            return
        await asyncio.gather(*mine, return_exceptions=True)


async def repair_fragments(io: FragmentIO, stats: EcStats, stripe: int, buf: Buffer, res: Resolved) -> list[int]:
    """Rewrite fragments ``res.bad`` in place with the resolved version (their headers
    restamped); from the shadow, those are every in-place fragment that lacked that version.

    The stripe may have been overwritten since it was decoded (a writer's version, whatever
    its writer's clock; on a spare swapped in meanwhile, whose chunk versions start afresh), so
    each fragment is looked at again first: its chunk's version at the head, then its content.
    It is rewritten only if it still holds what the decode saw there (the same stale header,
    BAD, or ABSENT: any write since changes that), and the rewrite is a fenced write
    (``if_ver_le`` = the version at the look), so a write landing after the look is never
    replaced either (review, sessions 13-14). The shadow is left: a newer overwrite may be
    staging there (its writer removes it), and a shadow no newer than the stripe in place is
    never used. Fragments on a chain known down are skipped; they are repaired one at a time
    (rare), and one that fails does not stop the others. Returns the fragments rewritten."""
    g = io.geometry
    stamp(g, buf, stripe, res.stripe_len, res.version, res.bad)
    scratch = memoryview(bytearray(slot_bytes(g)))

    async def one(j: int) -> bool:
        index = g.chunk_index(stripe, j)
        was = res.was.get(j)
        if io.down(index) or was is None:
            return False
        fence = await io.head_version(index)  # before the look: a write after it is fenced off
        now = await _read_one(io, scratch, stripe, j, shadow=False)
        if now is None or now != was:
            return False  # unreachable, or written since the decode read it
        try:
            await io.write(index, chunk_view(g, buf, j, g.payload_len(res.stripe_len, j)), exact=True,
                           if_ver_le=fence)
        except LoomError as exc:
            if exc.status is not Status.VERSION_MISMATCH:
                raise
            logger.info("inode %d stripe %d fragment %d: written since it was looked at; not repaired",
                        io.inode, stripe, j)
            return False
        return True

    done: list[int] = []
    for j in res.bad:
        try:
            if await one(j):
                done.append(j)
        except (LoomError, OSError) as exc:
            logger.warning("inode %d stripe %d: repair of fragment %d failed: %s", io.inode, stripe, j, exc)
    if done:
        stats.repaired_fragments_total += len(done)
        logger.info("inode %d stripe %d: repaired fragments %s (version %d)", io.inode, stripe, done, res.version)
    return done


async def read_range(io: FragmentIO, codec: Codec, stats: EcStats, pool: BufferPool, pos: int,
                     view: memoryview, *, parallel_max: int = 16, verify: bool = False) -> None:
    """Fill ``view`` with the file's bytes at ``pos`` (healthy: data fragments only).
    ``verify`` (a file written with fragments skipped, ``Layout.ec_reduced``): every stripe
    is resolved from all its fragments (headers and versions compared: a skipped fragment's
    old bytes are never served, and are repaired), not read from its data fragments alone."""
    g = io.geometry
    pieces = list(split_range(g, pos, len(view)))
    by_stripe: dict[int, list[FragPiece]] = {}
    for p in pieces:
        by_stripe.setdefault(p.stripe, []).append(p)
    sem = asyncio.Semaphore(max(1, parallel_max))

    async def piece(p: FragPiece) -> bool:
        async with sem:
            target = view[p.buffer_offset : p.buffer_offset + p.length]
            try:
                chunk_len = await io.read(g.chunk_index(p.stripe, p.fragment), p.offset, p.length, target)
            except FragmentUnavailable:
                return False
            if chunk_len is None or chunk_len < HEADER_BYTES:
                return False
            payload_end = chunk_len - HEADER_BYTES  # the trailer is not data: zeros past the payload
            if p.offset + p.length > payload_end:
                zero_fill(target[max(0, payload_end - p.offset) :])
            return True

    async def stripe(s: int, ps: list[FragPiece]) -> None:
        if not verify and not any(io.down(g.chunk_index(s, p.fragment)) for p in ps):  # else decoding
            oks = await asyncio.gather(*(piece(p) for p in ps))
            if all(oks):
                return
        buf = pool.acquire(stripe_buffer_bytes(g))
        try:
            # verify: all k+m (k of them could all be a skipped write's old fragments, which
            # agree with each other); the newest version with k good fragments wins
            res = await resolve(io, codec, stats, s, buf, full=verify)
            for p in ps:
                target = view[p.buffer_offset : p.buffer_offset + p.length]
                if res is None:
                    zero_fill(target)
                else:
                    target[:] = payload(g, buf, p.fragment)[p.offset : p.offset + p.length]
        finally:
            pool.release(buf)

    await asyncio.gather(*(stripe(s, ps) for s, ps in by_stripe.items()))
