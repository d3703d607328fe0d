"""In-memory ChunkEngine with the file engine's contract and crash semantics (simulator)."""

from __future__ import annotations

from dataclasses import dataclass

import crc32c

from loomfs.errors import NoSpace
from loomfs.storage.engine.base import (
    INDEX_END,
    ChunkEngine,
    ChunkKey,
    ChunkState,
    Usage,
    check_range,
    check_stage_version,
    missing_chunk,
    no_pending,
)


@dataclass(slots=True)
class _Version:
    ver: int
    data: bytearray
    crc: int


@dataclass(slots=True)
class _Slot:
    committed: _Version | None = None
    pending: _Version | None = None


class MemoryEngine(ChunkEngine):
    def __init__(self, capacity_bytes: int = 1 << 40):
        self.capacity_bytes = capacity_bytes
        self._slots: dict[ChunkKey, _Slot] = {}
        self._used_bytes = 0
        self.crashes = 0

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
        )

    def get(self, key: ChunkKey) -> ChunkState | None:
        slot = self._slots.get(key)
        return None if slot is None else self._state(key, slot)

    def read(self, key: ChunkKey, offset: int, into: memoryview, *, pending: bool = False) -> int:
        check_range(offset, len(into))
        slot = self._slots.get(key)
        v = None if slot is None else (slot.pending if pending else slot.committed)
        if v is None:
            raise no_pending(key, 0) if pending else missing_chunk(key)
        n = max(0, min(len(into), len(v.data) - offset))
        into[:n] = memoryview(v.data)[offset : offset + n]
        return n

    # ---- updates ----------------------------------------------------------------------
    def _stage(self, key: ChunkKey, version: int, data: bytearray) -> ChunkState:
        slot = self._slots.setdefault(key, _Slot())
        check_stage_version(self.get(key), key, version)
        grow = len(data) - (len(slot.committed.data) if slot.committed else 0)
        if grow > 0 and self._used_bytes + grow > self.capacity_bytes:
            if slot.committed is None and slot.pending is None:
                del self._slots[key]
            raise NoSpace(f"memory engine full ({self.capacity_bytes} bytes)")
        slot.pending = _Version(version, data, crc32c.crc32c(data))
        return self._state(key, slot)

    def stage_write(
        self,
        key: ChunkKey,
        version: int,
        offset: int,
        data: memoryview | bytes,
        *,
        data_crc: int | None = None,
        full_replace: bool = False,
    ) -> ChunkState:
        check_range(offset, len(data))
        slot = self._slots.get(key)
        if full_replace:
            return self._stage(key, version, bytearray(data))
        base = bytearray(slot.committed.data) if slot and slot.committed else bytearray()
        if len(base) < offset:
            base.extend(bytes(offset - len(base)))
        base[offset : offset + len(data)] = data
        return self._stage(key, version, base)

    def stage_truncate(self, key: ChunkKey, version: int, length: int) -> ChunkState:
        check_range(0, length)
        slot = self._slots.get(key)
        base = bytearray(slot.committed.data) if slot and slot.committed else bytearray()
        if len(base) > length:
            del base[length:]
        else:
            base.extend(bytes(length - len(base)))
        return self._stage(key, version, base)

    async def commit(self, key: ChunkKey, version: int) -> ChunkState:
        slot = self._slots.get(key)
        if slot is None or slot.pending is None or slot.pending.ver != version:
            raise no_pending(key, version)
        old = len(slot.committed.data) if slot.committed else 0
        self._used_bytes += len(slot.pending.data) - old
        slot.committed, slot.pending = slot.pending, None
        return self._state(key, slot)

    def abort(self, key: ChunkKey) -> None:
        slot = self._slots.get(key)
        if slot is None:
            return
        slot.pending = None
        if slot.committed is None:
            del self._slots[key]

    async def remove_range(self, inode: int, index_begin: int = 0, index_end: int = INDEX_END) -> int:
        doomed = [k for k in self._slots if k.inode == inode and index_begin <= k.index < index_end]
        removed = 0
        for k in doomed:
            slot = self._slots.pop(k)
            if slot.committed is not None:
                self._used_bytes -= len(slot.committed.data)
                removed += 1
        return removed

    def list_chunks(
        self, inode: int = 0, index_begin: int = 0, index_end: int = INDEX_END, limit: int = 10000
    ) -> list[ChunkState]:
        keys = sorted(
            k for k in self._slots if inode == 0 or (k.inode == inode and index_begin <= k.index < index_end)
        )
        return [self._state(k, self._slots[k]) for k in keys[:limit]]

    def usage(self) -> Usage:
        count = sum(1 for s in self._slots.values() if s.committed is not None)
        return Usage(self._used_bytes, count, self.capacity_bytes)

    # ---- simulation -------------------------------------------------------------------
    def crash(self) -> None:
        """Lose everything not committed, as a power cut would."""
        self.crashes += 1
        for key in list(self._slots):
            self.abort(key)

    def __repr__(self) -> str:
        return f"MemoryEngine(chunks={len(self._slots)} used={self._used_bytes}B crashes={self.crashes})"
