"""The ChunkEngine seam: one engine per storage target (one directory per disk).

A chunk is addressed by ``ChunkKey(inode, index)``. Per chunk the engine keeps the committed
version (readable), at most one pending update version (staged, invisible to readers until
committed), the committed length, the CRC32C of the committed content (what the wire carries for
whole-chunk reads) and the CRC32C of every ``BLOCK_BYTES`` block of it (the last one may be
short), so a partial read is checked against the disk too: a read that is not the whole chunk
from offset 0 verifies every block it touches and fails with ``CHECKSUM_MISMATCH``.

Crash semantics, shared by every engine (the conformance suite checks them): a crash loses
every pending update and nothing committed; after a crash each chunk holds exactly its last
committed version. ``commit`` is the only step that changes what readers see.

Versions: ``stage_*`` takes the update version the chain assigned; it must be newer than the
committed version. Staging again replaces the pending update (a re-forwarded update).

Bit rot and updates (the conformance suite checks this): an update never computes a new CRC over
committed bytes it has not checked, so rot on disk is never "blessed" into a version with valid
CRCs. A stage that keeps bytes of the committed version and reads or rehashes them (an overwrite
that does not cover the whole committed content, a shrinking truncate) verifies every kept block
it copies against the committed version's stored block CRC, and a bad one fails the stage with
``StatusError(CHECKSUM_MISMATCH, "... block i at offset ...")``: nothing is staged, the chunk
keeps its committed version (still readable: its good blocks; ``verify`` still reports the bad
ones), and a pending update staged before is dropped too (staging replaces it anyway; the same as
a failed stage that began). Blocks the update covers whole are not kept and not checked: a write
that covers a rotten block whole, a truncate that cuts it away, and a full replace (the repair)
succeed. Appends and zero-extending truncates read no old byte: they continue the stored block
CRC of the old last block and the stored whole-chunk CRC, so they succeed and the rot stays
visible (to partial reads, ``verify``, and the reader's whole-chunk CRC check).

Request tags (retry dedupe that survives a change of head, as in 3FS): each version carries up to
``TAGS_MAX`` ``ChunkTag(client_id, request_id, version)``, oldest first, persisted with the
chunk's metadata on every replica. ``stage_*(..., tags=...)`` gives the complete list the new
version will carry (the service computes it: the committed list plus the new request's tag, see
``tags_with``); ``tags=None`` keeps the committed version's list. An engine keeps the newest
``TAGS_MAX`` of a longer list, and refuses (InvalidArgument) a field outside 0..2**64-1. Tags
follow their version exactly: ``ChunkState.pending_tags`` shows the pending version's list,
``ChunkState.tags`` the committed one's; ``commit`` makes the pending list the committed one (in
the same index row write as the length and CRCs: no extra statement, no extra fsync); ``abort``
and a crash lose the pending list with the pending update and never the committed one;
``remove_range`` drops them with the chunk.
"""

from __future__ import annotations

import array
import bisect
import functools
import struct
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

import crc32c

from loomfs.errors import InvalidArgument, NotFound, StatusError
from loomfs.wire.status import Status

INDEX_END = 1 << 62
BLOCK_BYTES = 64 << 10  # unit of the per-block CRC32Cs
TAGS_MAX = 32  # request tags (one per client: its last request) kept per chunk version, oldest first
_ZEROS = bytes(1 << 20)


@dataclass(frozen=True, slots=True, order=True)
class ChunkKey:
    inode: int
    index: int

    def __str__(self) -> str:
        return f"{self.inode:x}/{self.index}"


@dataclass(frozen=True, slots=True)
class ChunkTag:
    """One client request that produced an update: (client, request) -> the version it made."""

    client_id: int
    request_id: int
    version: int  # the update version this request produced


@dataclass(frozen=True, slots=True)
class ChunkState:
    """What the engine knows about one chunk (committed part + the pending update, if any)."""

    key: ChunkKey
    commit_ver: int = 0  # 0 = never committed (only a pending update exists)
    length: int = 0  # committed length
    crc: int = 0  # CRC32C of the committed content
    pending_ver: int = 0  # 0 = none
    pending_length: int = 0
    pending_crc: int = 0
    tags: tuple[ChunkTag, ...] = ()  # the committed version's request tags, oldest first
    pending_tags: tuple[ChunkTag, ...] = ()  # what the pending version will carry; () = none

    @property
    def has_pending(self) -> bool:
        return self.pending_ver > self.commit_ver


@dataclass(frozen=True, slots=True)
class Usage:
    used_bytes: int = 0
    chunk_count: int = 0
    capacity_bytes: int = 0


# ---- request tags: packed as little-endian (u64 client, u64 request, u64 version) triples ---
_TAG = struct.Struct("<QQQ")


def tags_with(tags: tuple[ChunkTag, ...], tag: ChunkTag) -> tuple[ChunkTag, ...]:
    """``tags`` plus ``tag``, trimmed to the newest TAGS_MAX (the list a new version carries)."""
    return (*tags[-(TAGS_MAX - 1) :], tag)


class TagListCache:
    """Decoded tag lists by their packed bytes, for the chunks being written now: ``get`` runs
    several times per write (the service's check, stage, commit) and decoding 8 tags costs ~3 us,
    while engines keep tags packed (24 bytes a tag). ``encode_tags`` puts the list it was given, so
    a write decodes nothing. Bounded; the oldest entry goes first. Shared by every engine in the
    process (entries are immutable, keyed by content); plain dict operations only."""

    def __init__(self, entries_max: int = 4096):
        self.entries_max = entries_max
        self._lists: dict[bytes, tuple[ChunkTag, ...]] = {}
        self.hits = self.misses = 0

    def put(self, packed: bytes, tags: tuple[ChunkTag, ...]) -> None:
        if packed not in self._lists and len(self._lists) >= self.entries_max:
            self._lists.pop(next(iter(self._lists)), None)
        self._lists[packed] = tags

    def decode(self, packed: bytes) -> tuple[ChunkTag, ...]:
        if not packed:
            return ()
        tags = self._lists.get(packed)
        if tags is not None:
            self.hits += 1
            return tags
        self.misses += 1
        tags = tuple(ChunkTag(c, r, v) for c, r, v in _TAG.iter_unpack(packed))
        self.put(packed, tags)
        return tags

    def __repr__(self) -> str:
        return f"TagListCache(entries={len(self._lists)}/{self.entries_max} hits={self.hits} misses={self.misses})"


TAG_LISTS = TagListCache()


def encode_tags(tags: tuple[ChunkTag, ...]) -> bytes:
    """The newest TAGS_MAX of ``tags``, packed; InvalidArgument on a field outside u64."""
    if not tags:
        return b""
    tags = tuple(tags[-TAGS_MAX:])
    out = bytearray(_TAG.size * len(tags))
    try:
        for i, t in enumerate(tags):
            _TAG.pack_into(out, _TAG.size * i, t.client_id, t.request_id, t.version)
    except struct.error as exc:
        raise InvalidArgument(f"bad request tag in {tags}: {exc}") from exc
    packed = bytes(out)
    TAG_LISTS.put(packed, tags)
    return packed


def decode_tags(packed: bytes) -> tuple[ChunkTag, ...]:
    """Packed tags as ChunkTags (through ``TAG_LISTS``)."""
    return TAG_LISTS.decode(packed)


def tags_ok(packed: bytes) -> bool:
    """Is this a well-formed packed tag list (as stored)?"""
    return len(packed) % _TAG.size == 0 and len(packed) <= _TAG.size * TAGS_MAX


def crc_zeros(count: int, value: int = 0) -> int:
    """CRC32C of ``count`` zero bytes, continuing from ``value``."""
    while count > 0:
        step = min(count, len(_ZEROS))
        value = crc32c.crc32c(memoryview(_ZEROS)[:step], value)
        count -= step
    return value


_ZERO_BLOCK_CRC = crc_zeros(BLOCK_BYTES)


# ---- per-block CRCs: packed as little-endian uint32s, one per BLOCK_BYTES block -------------
def block_count(length: int) -> int:
    return (length + BLOCK_BYTES - 1) // BLOCK_BYTES


def block_crc(blocks: bytes, i: int) -> int:
    """The stored CRC of block ``i``."""
    return int(struct.unpack_from("<I", blocks, 4 * i)[0])


def unpack_blocks(blocks: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(blocks) // 4}I", blocks))


def block_crcs_of(data: memoryview | bytes | bytearray) -> bytes:
    """Packed block CRCs of content ``data`` (from offset 0)."""
    mv = memoryview(data)
    out = bytearray(4 * block_count(len(mv)))
    for i, pos in enumerate(range(0, len(mv), BLOCK_BYTES)):
        struct.pack_into("<I", out, 4 * i, crc32c.crc32c(mv[pos : pos + BLOCK_BYTES]))
    return bytes(out)


def restage_blocks(
    old: bytes, old_len: int, new_len: int, lo: int, hi: int, crc_of: Callable[[int, int, int], int]
) -> bytes:
    """Block CRCs of a new version made from one of ``old_len`` bytes (block CRCs ``old``) by
    changing bytes [lo, hi) and setting the length to ``new_len``. Only the blocks that overlap
    [lo, hi) or whose extent changed are recomputed, with ``crc_of(index, start, end)`` (the new
    content's block [start, end)); every other block keeps its CRC."""
    nb = block_count(new_len)
    out = bytearray(old[: 4 * nb])
    if len(out) < 4 * nb:
        out += bytes(4 * nb - len(out))
    spans = [(lo // BLOCK_BYTES, min(nb, block_count(hi)))] if hi > lo else []
    if old_len != new_len:  # the block holding the old/new end changed its extent; new blocks
        spans.append((min(old_len, new_len) // BLOCK_BYTES, nb))
    done = 0
    for first, end in sorted(spans):
        for i in range(max(first, done), end):
            start = i * BLOCK_BYTES
            struct.pack_into("<I", out, 4 * i, crc_of(i, start, min(start + BLOCK_BYTES, new_len)))
        done = max(done, end)
    return bytes(out)


def _crc_span(value: int, start: int, end: int, data: memoryview, data_off: int) -> int:
    """Continue ``value`` over bytes [start, end) of a region that is zeros except ``data`` at
    ``data_off``."""
    data_end = data_off + len(data)
    if start < min(end, data_off):
        count = min(end, data_off) - start
        value = _ZERO_BLOCK_CRC if value == 0 and count == BLOCK_BYTES else crc_zeros(count, value)
        start += count
    if start < min(end, data_end):
        value = crc32c.crc32c(data[start - data_off : min(end, data_end) - data_off], value)
        start = min(end, data_end)
    if start < end:
        count = end - start
        value = _ZERO_BLOCK_CRC if value == 0 and count == BLOCK_BYTES else crc_zeros(count, value)
    return value


def extend_blocks(
    old: bytes, old_len: int, new_len: int, data: memoryview | bytes | bytearray, data_off: int
) -> bytes:
    """Block CRCs after growing content of ``old_len`` bytes (block CRCs ``old``) to ``new_len``:
    the new bytes are zeros except ``data`` at ``data_off`` (an append, a write past the end, a
    zero-extending truncate). No old byte is read again: the old short last block's CRC is
    continued over the bytes that join it."""
    mv = memoryview(data)

    def crc_of(i: int, start: int, end: int) -> int:
        if start < old_len:
            return _crc_span(block_crc(old, i), old_len, end, mv, data_off)
        return _crc_span(0, start, end, mv, data_off)

    return restage_blocks(old, old_len, new_len, old_len, new_len, crc_of)


@functools.cache
def _block_shift_table() -> array.array[int]:
    """Byte tables (4 x 256, flat) of the GF(2)-linear map G(v) = crc32c(BLOCK_BYTES zeros, v) ^
    crc32c(BLOCK_BYTES zeros): since crc32c(X, v) = crc32c(X) ^ G(v) for any whole block X, a
    whole-chunk CRC is carried over a block from that block's own CRC (32 hashes of a block of
    zeros to build, once). Packed uint32s: 4 KiB that stay cache-friendly next to a 4 MiB copy."""
    cols = [crc_zeros(BLOCK_BYTES, 1 << k) ^ _ZERO_BLOCK_CRC for k in range(32)]
    table = array.array("I", bytes(4 * 1024))
    for j in range(4):
        for b in range(1, 256):
            low = b & -b
            table[256 * j + b] = table[256 * j + (b ^ low)] ^ cols[8 * j + low.bit_length() - 1]
    return table


def crc_join_blocks(value: int, blocks: list[int]) -> int:
    """CRC32C of content whose CRC32C is ``value`` followed by whole BLOCK_BYTES blocks whose own
    CRC32Cs are ``blocks`` (no byte hashed again: four table lookups a block)."""
    t = _block_shift_table()
    for block in blocks:
        value = (block ^ t[value & 0xFF] ^ t[256 + ((value >> 8) & 0xFF)] ^ t[512 + ((value >> 16) & 0xFF)]
                 ^ t[768 + (value >> 24)])
    return value


def crc_of_blocks(blocks: bytes, length: int) -> int:
    """The CRC32C of content of ``length`` bytes from its packed block CRCs (no byte read): the
    whole blocks are joined by table, the short last one (``t`` bytes) through the CRC of ``t``
    zero bytes, since crc32c(X, v) = crc32c(X) ^ crc32c(zeros(t), v) ^ crc32c(zeros(t))."""
    crcs = unpack_blocks(blocks)
    tail = length % BLOCK_BYTES
    value = crc_join_blocks(0, crcs[:-1] if tail else crcs)
    if tail:
        value = crcs[-1] ^ crc_zeros(tail, value) ^ crc_zeros(tail)
    return value


def block_mismatch(key: ChunkKey, i: int, stored: int, computed: int, why: str = "") -> StatusError:
    return StatusError(
        Status.CHECKSUM_MISMATCH,
        f"chunk {key} block {i} at offset {i * BLOCK_BYTES}: CRC mismatch "
        f"(stored {stored:08x}, computed {computed:08x}){why}",
    )


def check_blocks(key: ChunkKey, blocks: bytes, first: int, view: memoryview, why: str = "") -> None:
    """Raise CHECKSUM_MISMATCH unless every block of ``view`` (the content from the start of
    block ``first``, whole blocks but for the chunk's short last one) matches its stored CRC."""
    for j, pos in enumerate(range(0, len(view), BLOCK_BYTES)):
        computed = crc32c.crc32c(view[pos : pos + BLOCK_BYTES])
        stored = block_crc(blocks, first + j)
        if computed != stored:
            raise block_mismatch(key, first + j, stored, computed, why)


def kept_blocks(old_len: int, lo: int, hi: int) -> tuple[tuple[range, range], list[int]]:
    """The blocks of committed content of ``old_len`` bytes that an update changing (or cutting
    away) bytes [lo, hi) keeps old bytes of: (the blocks entirely before and after [lo, hi), the
    blocks it covers only in part: at most two). A block covered whole keeps nothing."""
    nb = block_count(old_len)
    if hi <= lo or lo >= old_len:
        return (range(nb), range(nb, nb)), []
    first, last = lo // BLOCK_BYTES, (min(hi, old_len) - 1) // BLOCK_BYTES
    part = [first] if lo % BLOCK_BYTES else []
    if hi < min((last + 1) * BLOCK_BYTES, old_len) and last not in part:
        part.append(last)
    return (range(first), range(last + 1, nb)), part


def first_changed(blocks: bytes, computed: bytes, kept: tuple[range, ...]) -> int:
    """The first block of ranges ``kept`` whose CRC differs between two packed block CRC lists,
    or -1 (whole ranges compared at once: the common case is no difference)."""
    for r in kept:
        span = slice(4 * r.start, 4 * r.stop)
        if blocks[span] != computed[span]:
            return next(i for i in r if blocks[4 * i : 4 * i + 4] != computed[4 * i : 4 * i + 4])
    return -1


def kept_why(version: int) -> str:
    """What a refused stage adds to its CHECKSUM_MISMATCH message."""
    return f"; update v{version} would keep its bytes: refused (the chunk needs a repair: a full replace)"


def bad_blocks(blocks: bytes, computed: bytes) -> list[int]:
    """Indexes whose CRC differs between two packed block CRC lists of the same content."""
    return [i for i in range(len(blocks) // 4) if blocks[4 * i : 4 * i + 4] != computed[4 * i : 4 * i + 4]]


def check_stage_version(state: ChunkState | None, key: ChunkKey, version: int) -> None:
    committed = state.commit_ver if state is not None else 0
    if version <= committed:
        raise StatusError(
            Status.VERSION_MISMATCH, f"chunk {key}: update v{version} is not newer than committed v{committed}"
        )


def check_range(offset: int, length: int) -> None:
    if offset < 0 or length < 0:
        raise InvalidArgument(f"bad range offset={offset} length={length}")


def no_pending(key: ChunkKey, version: int) -> NotFound:
    return NotFound(f"chunk {key}: no pending update v{version}")


def missing_chunk(key: ChunkKey) -> NotFound:
    return NotFound(f"chunk {key} has no committed version")


V = TypeVar("V")


class ChunkMap(Generic[V]):
    """inode -> index -> value, listed in (inode, index) order without sorting the whole key set
    per page (a target may hold millions of chunks and resync pages through all of them).

    Inodes live in a big sorted list plus a small inbox of new ones: a listing sorts the inbox in
    place (cheap: it is mostly sorted already) and walks both lists at once; the inbox is folded
    into the big list only when it outgrows 1/64 of it, so a new inode costs O(1) amortized and a
    page costs O(page + inbox) whatever the target's size. An inode that empties stays listed
    (skipped, counted as stale) until stale ones are a quarter of all, then both are rebuilt.
    Each inode's indexes are sorted when listed; for inodes with many chunks that order is cached
    until their key set changes.
    """

    _ORDER_CACHE_MIN = 64  # inodes with at least this many chunks keep their sorted indexes
    _INBOX_MIN = 1024  # the inbox is folded in past this + 1/64 of the big list
    _STALE_MIN = 64  # rebuild past this many stale entries (and a quarter of all)

    def __init__(self) -> None:
        self._by_inode: dict[int, dict[int, V]] = {}
        self._inodes: list[int] = []  # sorted; may hold emptied inodes and repeats (stale)
        self._inbox: list[int] = []
        self._stale = 0
        self._order: dict[int, list[int]] = {}
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def get(self, inode: int, index: int) -> V | None:
        d = self._by_inode.get(inode)
        return None if d is None else d.get(index)

    def put(self, inode: int, index: int, value: V) -> None:
        d = self._by_inode.get(inode)
        if d is None:
            d = self._by_inode[inode] = {}
            self._inbox.append(inode)
        if index not in d:
            self._len += 1
            self._order.pop(inode, None)
        d[index] = value

    def pop(self, inode: int, index: int) -> V | None:
        d = self._by_inode.get(inode)
        if d is None or index not in d:
            return None
        value = d.pop(index)
        self._len -= 1
        self._order.pop(inode, None)
        if not d:
            del self._by_inode[inode]
            self._stale += 1
        return value

    def items(self) -> Iterator[tuple[ChunkKey, V]]:
        """Every (key, value), in no particular order."""
        for inode, d in self._by_inode.items():
            for index, value in d.items():
                yield ChunkKey(inode, index), value

    def inode_range(self, inode: int, index_begin: int = 0, index_end: int = INDEX_END) -> list[tuple[int, V]]:
        """(index, value) of ``inode``'s indexes in [index_begin, index_end), in order."""
        return [(k.index, v) for k, v in self._scan_inode(inode, index_begin, index_end)]

    def scan(
        self, after: ChunkKey | None = None, inode: int = 0, index_begin: int = 0, index_end: int = INDEX_END
    ) -> Iterator[tuple[ChunkKey, V]]:
        """(key, value) in (inode, index) order, only keys strictly greater than ``after``;
        ``inode`` != 0 keeps to that inode's [index_begin, index_end). Do not change the map
        while iterating."""
        if inode:
            if after is not None and after.inode >= inode:
                if after.inode > inode:
                    return
                index_begin = max(index_begin, after.index + 1)
            yield from self._scan_inode(inode, index_begin, index_end)
            return
        main, inbox = self._sorted_inodes()
        prev = -1
        if after is not None:
            yield from self._scan_inode(after.inode, after.index + 1, INDEX_END)
            prev = after.inode
        i, j = bisect.bisect_right(main, prev), bisect.bisect_right(inbox, prev)
        while True:  # merge the two sorted lists; repeats (stale entries) are skipped
            if i < len(main) and (j == len(inbox) or main[i] <= inbox[j]):
                ino, i = main[i], i + 1
            elif j < len(inbox):
                ino, j = inbox[j], j + 1
            else:
                return
            if ino != prev:
                prev = ino
                yield from self._scan_inode(ino, 0, INDEX_END)

    def _scan_inode(self, inode: int, lo: int, hi: int) -> Iterator[tuple[ChunkKey, V]]:
        d = self._by_inode.get(inode)
        if not d or lo >= hi:
            return
        if len(d) < self._ORDER_CACHE_MIN:
            order = sorted(d)
        else:
            cached = self._order.get(inode)
            order = self._order[inode] = sorted(d) if cached is None else cached
        for i in range(bisect.bisect_left(order, lo) if lo else 0, len(order)):
            index = order[i]
            if index >= hi:
                return
            yield ChunkKey(inode, index), d[index]

    def _sorted_inodes(self) -> tuple[list[int], list[int]]:
        if self._stale > self._STALE_MIN and 4 * self._stale > len(self._inodes) + len(self._inbox):
            self._inodes, self._stale = sorted(self._by_inode), 0
            self._inbox.clear()
        elif len(self._inbox) > self._INBOX_MIN + len(self._inodes) // 64:
            self._inodes += self._inbox
            self._inbox.clear()
            self._inodes.sort()
        else:
            self._inbox.sort()
        return self._inodes, self._inbox

    def __repr__(self) -> str:
        return f"ChunkMap(chunks={self._len} inodes={len(self._by_inode)} stale={self._stale})"


class ChunkEngine(ABC):
    """Chunk storage for one target. Reads are synchronous (page cache); commit may fsync."""

    @abstractmethod
    def get(self, key: ChunkKey) -> ChunkState | None:
        """Current state of a chunk, or None when it has neither committed nor pending data."""

    @abstractmethod
    def read(self, key: ChunkKey, offset: int, into: memoryview, *, pending: bool = False) -> int:
        """Copy committed bytes [offset, offset+len(into)) into ``into``; returns bytes read
        (shorter at the end of the chunk). ``pending=True`` reads the pending update instead
        (re-forwarding). Raises NotFound when there is no such version. A committed read that is
        not the whole chunk from offset 0 checks every block it touches and raises
        StatusError(CHECKSUM_MISMATCH) on a bad one; a whole-chunk read is not checked here (the
        reader checks the whole-chunk CRC)."""

    @abstractmethod
    def block_crcs(self, key: ChunkKey, *, pending: bool = False) -> list[int]:
        """The stored CRC32C of each BLOCK_BYTES block of the committed (or pending) content."""

    def verify(self, key: ChunkKey) -> list[int]:
        """Check the committed content against its block CRCs; returns the bad block indexes
        (empty: good). Generic version: one whole-chunk read into a fresh buffer."""
        st = self.get(key)
        if st is None or not st.commit_ver:
            raise missing_chunk(key)
        stored = self.block_crcs(key)
        buf = bytearray(st.length)
        self.read(key, 0, memoryview(buf))
        return bad_blocks(struct.pack(f"<{len(stored)}I", *stored), block_crcs_of(buf))

    @abstractmethod
    def stage_write(
        self,
        key: ChunkKey,
        version: int,
        offset: int,
        data: memoryview | bytes,
        *,
        data_crc: int | None = None,
        full_replace: bool = False,
        tags: tuple[ChunkTag, ...] | None = None,
    ) -> ChunkState:
        """Stage update ``version``: the committed content with ``data`` written at ``offset``
        (a gap past the end reads as zeros), or exactly ``data`` when ``full_replace``. ``tags``:
        the request tags the version carries once committed (None: the committed version's)."""

    async def aread(self, key: ChunkKey, offset: int, into: memoryview) -> int:
        """``read`` of committed data that may run off the event loop (big disk reads)."""
        return self.read(key, offset, into)

    async def astage_write(
        self,
        key: ChunkKey,
        version: int,
        offset: int,
        data: memoryview | bytes,
        *,
        data_crc: int | None = None,
        full_replace: bool = False,
        tags: tuple[ChunkTag, ...] | None = None,
    ) -> ChunkState:
        """``stage_write`` that may run its disk write off the event loop."""
        return self.stage_write(key, version, offset, data, data_crc=data_crc, full_replace=full_replace, tags=tags)

    @abstractmethod
    def stage_truncate(
        self, key: ChunkKey, version: int, length: int, *, tags: tuple[ChunkTag, ...] | None = None
    ) -> ChunkState:
        """Stage update ``version``: the committed content cut or zero-extended to ``length``
        (``tags`` as for ``stage_write``)."""

    @abstractmethod
    async def commit(self, key: ChunkKey, version: int) -> ChunkState:
        """Make pending ``version`` (and its tags) the committed one (durably when the engine
        fsyncs)."""

    @abstractmethod
    def abort(self, key: ChunkKey) -> None:
        """Drop the pending update (and its tags), if any."""

    @abstractmethod
    async def remove_range(self, inode: int, index_begin: int = 0, index_end: int = INDEX_END) -> int:
        """Remove chunks [index_begin, index_end) of ``inode`` (committed and pending);
        returns how many chunks were removed."""

    @abstractmethod
    def list_chunks(
        self,
        inode: int = 0,
        index_begin: int = 0,
        index_end: int = INDEX_END,
        limit: int = 10000,
        *,
        after: ChunkKey | None = None,
    ) -> list[ChunkState]:
        """Up to ``limit`` chunks (committed or pending only) in (inode, index) order;
        ``inode=0`` lists all inodes (index range ignored). ``after`` resumes a listing: only
        chunks strictly greater than it in (inode, index) order (pass the last key of a page)."""

    @abstractmethod
    def usage(self) -> Usage: ...

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release files; the engine is unusable afterwards."""
