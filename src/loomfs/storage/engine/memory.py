"""In-memory ChunkEngine with the file engine's contract and crash semantics (simulator).

Block CRCs follow the file engine's rules exactly (the same helpers from ``base``): a whole
write hashes every block, an append continues the old last block's CRC (and the whole-chunk CRC),
an overwrite or a shrinking truncate first checks every block whose old bytes it keeps (refusing
a rotten one, see ``base``) and recomputes only the blocks it touches from the new bytes. So
``corrupt`` (bit rot for tests) is caught by partial reads, ``verify`` and later updates just as
a flipped byte on disk is.
Request tags are kept packed, as the file engine keeps them, and follow their version.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from itertools import islice

import crc32c

from loomfs.errors import NoSpace
from loomfs.storage.engine.base import ChunkEngine
from loomfs.storage.engine.blocks import (
    bad_blocks,
    block_crc,
    block_crcs_of,
    block_mismatch,
    check_blocks,
    check_range,
    check_stage_version,
    crc_zeros,
    extend_blocks,
    joined_block,
    kept_blocks,
    kept_why,
    missing_chunk,
    no_pending,
    restage_blocks,
    unpack_blocks,
)
from loomfs.storage.engine.chunkmap import ChunkMap
from loomfs.storage.engine.tags import decode_tags, encode_tags
from loomfs.storage.engine.types import (
    BLOCK_BYTES,
    INDEX_END,
    ChunkKey,
    ChunkState,
    ChunkTag,
    Usage,
)


@dataclass(slots=True)
class _Version:
    ver: int
    data: bytearray
    crc: int
    blocks: bytes  # packed block CRCs
    tags: bytes  # packed request tags


@dataclass(slots=True)
class _Slot:
    committed: _Version | None = None
    pending: _Version | None = None


class MemoryEngine(ChunkEngine):
    def __init__(self, capacity_bytes: int = 1 << 40):
        self.capacity_bytes = capacity_bytes
        self._slots: ChunkMap[_Slot] = ChunkMap()
        self._used_bytes = 0
        self._committed = 0  # chunks with a committed version
        self.crashes = 0
        self._durable_pending: dict[ChunkKey, int] = {}  # chunk -> pending version staged for a durable write
        self.failed = ""
        # simulator/test seam: the next this many durable commits fail their fsync (EIO), which
        # takes the target out of service (engine.diskfail) until the next crash (a restart
        # that verified it: memory holds exactly what was committed)
        self.fail_fsyncs = 0
        self.fsync_every_commit = False  # the fault above hits every commit, not only durable ones
        self.marker_refused = False  # simulator seam: the FSYNC_FAILED marker did not reach the disk
        self.suspect_chunks: list[ChunkKey] = []

    # ---- state ------------------------------------------------------------------------
    def _state(self, key: ChunkKey, slot: _Slot) -> ChunkState:
        c, p = slot.committed, slot.pending
        return ChunkState(
            key=key,
            commit_ver=c.ver if c else 0,
            length=len(c.data) if c else 0,
            crc=c.crc if c else 0,
            pending_ver=p.ver if p else 0,
            pending_length=len(p.data) if p else 0,
            pending_crc=p.crc if p else 0,
            tags=decode_tags(c.tags) if c else (),
            pending_tags=decode_tags(p.tags) if p else (),
        )

    def get(self, key: ChunkKey) -> ChunkState | None:
        slot = self._slots.get(key.inode, key.index)
        return None if slot is None else self._state(key, slot)

    def _version(self, key: ChunkKey, pending: bool) -> _Version:
        slot = self._slots.get(key.inode, key.index)
        v = None if slot is None else (slot.pending if pending else slot.committed)
        if v is None:
            raise no_pending(key, 0) if pending else missing_chunk(key)
        return v

    def read(self, key: ChunkKey, offset: int, into: memoryview, *, pending: bool = False) -> int:
        check_range(offset, len(into))
        v = self._version(key, pending)
        n = max(0, min(len(into), len(v.data) - offset))
        data = memoryview(v.data)
        if n and not pending and not (offset == 0 and n == len(v.data)):
            first, last = offset // BLOCK_BYTES, (offset + n - 1) // BLOCK_BYTES
            check_blocks(key, v.blocks, first, data[first * BLOCK_BYTES : (last + 1) * BLOCK_BYTES])
        into[:n] = data[offset : offset + n]
        return n

    def block_crcs(self, key: ChunkKey, *, pending: bool = False) -> list[int]:
        return unpack_blocks(self._version(key, pending).blocks)

    def verify(self, key: ChunkKey) -> list[int]:
        v = self._version(key, False)
        return bad_blocks(v.blocks, block_crcs_of(v.data))

    # ---- updates ----------------------------------------------------------------------
    def _stage(
        self, key: ChunkKey, version: int, data: bytearray, crc: int, blocks: bytes, tags: tuple[ChunkTag, ...] | None
    ) -> ChunkState:
        slot = self._slots.get(key.inode, key.index)
        if tags is not None:
            packed = encode_tags(tags)
        else:
            packed = slot.committed.tags if slot is not None and slot.committed is not None else b""
        if slot is None:
            slot = _Slot()
            self._slots.put(key.inode, key.index, slot)
        grow = len(data) - (len(slot.committed.data) if slot.committed else 0)
        if grow > 0 and self._used_bytes + grow > self.capacity_bytes:
            if slot.committed is None and slot.pending is None:
                self._slots.pop(key.inode, key.index)
            raise NoSpace(f"memory engine full ({self.capacity_bytes} bytes)")
        slot.pending = _Version(version, data, crc, blocks, packed)
        return self._state(key, slot)

    def _committed_of(self, key: ChunkKey, version: int) -> _Version | None:
        """The committed version an update ``version`` starts from (checked to be older)."""
        check_stage_version(self.get(key), key, version)
        slot = self._slots.get(key.inode, key.index)
        return slot.committed if slot else None

    def _check_kept(self, key: ChunkKey, version: int, c: _Version, lo: int, hi: int) -> None:
        """Refuse (CHECKSUM_MISMATCH, dropping any pending update) an update that changes bytes
        [lo, hi) of ``c`` when a block whose old bytes it keeps no longer matches its CRC."""
        (before, after), part = kept_blocks(len(c.data), lo, hi)
        self._check_blocks(key, version, c, sorted([*before, *part, *after]))

    def _check_blocks(self, key: ChunkKey, version: int, c: _Version, indexes: list[int]) -> None:
        view = memoryview(c.data)
        for i in indexes:
            start = i * BLOCK_BYTES
            computed, stored = crc32c.crc32c(view[start : start + BLOCK_BYTES]), block_crc(c.blocks, i)
            if computed != stored:
                self.abort(key)
                raise block_mismatch(key, i, stored, computed, kept_why(version))

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
        check_range(offset, len(data))
        c = self._committed_of(key, version)
        old_len, n = (len(c.data) if c else 0), len(data)
        if c is None or full_replace or (offset == 0 and n >= old_len):
            new = bytearray(offset) + data if c is None else bytearray(data)
            return self._stage(key, version, new, crc32c.crc32c(new), block_crcs_of(new), tags)
        if offset >= old_len:  # append / write past the end: the stored CRCs continue
            self._check_blocks(key, version, c, joined_block(old_len))
            base = bytearray(c.data) + bytes(offset - old_len)
            base += data
            crc = crc32c.crc32c(data, crc_zeros(offset - old_len, c.crc))
            return self._stage(key, version, base, crc, extend_blocks(c.blocks, old_len, offset + n, data, offset), tags)
        self._check_kept(key, version, c, offset, offset + n)
        base = bytearray(c.data)
        base[offset : offset + n] = data
        view = memoryview(base)
        blocks = restage_blocks(c.blocks, old_len, len(base), offset, offset + n,
                                lambda i, s, e: crc32c.crc32c(view[s:e]))
        return self._stage(key, version, base, crc32c.crc32c(base), blocks, tags)

    def stage_truncate(
        self, key: ChunkKey, version: int, length: int, *, tags: tuple[ChunkTag, ...] | None = None
    ) -> ChunkState:
        check_range(0, length)
        c = self._committed_of(key, version)
        if c is None:
            new = bytearray(length)
            return self._stage(key, version, new, crc_zeros(length), block_crcs_of(new), tags)
        old_len = len(c.data)
        if length >= old_len:  # zero-extend: the stored CRCs continue
            self._check_blocks(key, version, c, joined_block(old_len))
            base = bytearray(c.data) + bytes(length - old_len)
            crc = crc_zeros(length - old_len, c.crc)
            return self._stage(key, version, base, crc, extend_blocks(c.blocks, old_len, length, b"", length), tags)
        self._check_kept(key, version, c, length, old_len)
        base = bytearray(memoryview(c.data)[:length])
        view = memoryview(base)
        blocks = restage_blocks(c.blocks, old_len, length, length, length,
                                lambda i, s, e: crc32c.crc32c(view[s:e]))
        return self._stage(key, version, base, crc32c.crc32c(base), blocks, tags)

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
        sync: bool = False,
    ) -> ChunkState:
        st = self.stage_write(key, version, offset, data, data_crc=data_crc, full_replace=full_replace, tags=tags)
        if sync:
            self._durable_pending[key] = version
        return st

    def pending_durable(self, key: ChunkKey) -> bool:
        slot = self._slots.get(key.inode, key.index)
        return slot is not None and slot.pending is not None and self._durable_pending.get(key) == slot.pending.ver

    async def commit(self, key: ChunkKey, version: int, *, durable: bool = False) -> ChunkState:
        if self.failed:
            raise OSError(errno.EIO, f"target out of service: {self.failed}")
        slot = self._slots.get(key.inode, key.index)
        if slot is None or slot.pending is None or slot.pending.ver != version:
            raise no_pending(key, version)
        if self.fail_fsyncs and (durable or self.fsync_every_commit or self._durable_pending.get(key) == version):
            self.fail_fsyncs -= 1
            self.failed = "fsync failed: injected EIO"
            if self.on_failed is not None:
                self.on_failed(self.failed)
            raise OSError(errno.EIO, "injected fsync failure")
        old = len(slot.committed.data) if slot.committed else 0
        self._used_bytes += len(slot.pending.data) - old
        self._committed += slot.committed is None
        slot.committed, slot.pending = slot.pending, None
        return self._state(key, slot)

    def abort(self, key: ChunkKey) -> None:
        slot = self._slots.get(key.inode, key.index)
        if slot is None:
            return
        slot.pending = None
        if slot.committed is None:
            self._slots.pop(key.inode, key.index)

    async def remove_range(self, inode: int, index_begin: int = 0, index_end: int = INDEX_END) -> int:
        removed = 0
        for index, slot in self._slots.inode_range(inode, index_begin, index_end):
            self._slots.pop(inode, index)
            if slot.committed is not None:
                self._used_bytes -= len(slot.committed.data)
                self._committed -= 1
                removed += 1
        return removed

    def list_chunks(
        self,
        inode: int = 0,
        index_begin: int = 0,
        index_end: int = INDEX_END,
        limit: int = 10000,
        *,
        after: ChunkKey | None = None,
    ) -> list[ChunkState]:
        scan = self._slots.scan(after, inode, index_begin, index_end)
        return [self._state(k, slot) for k, slot in islice(scan, max(0, limit))]

    def usage(self) -> Usage:
        return Usage(self._used_bytes, self._committed, self.capacity_bytes)

    # ---- simulation -------------------------------------------------------------------
    def crash(self) -> None:
        """Lose everything not committed, as a power cut would. After a failed fsync the next
        process verifies the target (its FSYNC_FAILED marker), unless ``marker_refused``: the
        failing disk refused the marker too, and only mgmtd remembers the failure."""
        self.crashes += 1
        for key, _ in list(self._slots.items()):
            self.abort(key)
        failed, self.failed = self.failed, ""
        self.verified, self.suspect_chunks = False, []  # a new process
        if failed and not self.marker_refused:
            self._verify_all()  # suspects: pages the failing disk lost
        self.marker_refused = False

    def start_verification(self) -> None:
        if not self.failed:
            self._verify_all()

    def _verify_all(self) -> None:
        self.suspect_chunks = [k for k, slot in self._slots.items() if slot.committed is not None
                               and bad_blocks(slot.committed.blocks, block_crcs_of(slot.committed.data))]
        self.verified = True

    def corrupt(self, key: ChunkKey, offset: int) -> None:
        """Tests: flip every bit of one committed byte, updating no CRC (bit rot on disk)."""
        self._version(key, False).data[offset] ^= 0xFF

    def __repr__(self) -> str:
        return f"MemoryEngine(chunks={len(self._slots)} used={self._used_bytes}B crashes={self.crashes})"
