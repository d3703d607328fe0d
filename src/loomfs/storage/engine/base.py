"""The ChunkEngine seam: one engine per storage target (one directory per disk).

A chunk is addressed by ``ChunkKey(inode, index)``. Per chunk the engine keeps the committed
version (readable), at most one pending update version (staged, invisible to readers until
committed), the committed length and the CRC32C of the committed content.

Crash semantics, shared by every engine (the conformance suite checks them): a crash loses
every pending update and nothing committed; after a crash each chunk holds exactly its last
committed version. ``commit`` is the only step that changes what readers see.

Versions: ``stage_*`` takes the update version the chain assigned; it must be newer than the
committed version. Staging again replaces the pending update (a re-forwarded update).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import crc32c

from loomfs.errors import InvalidArgument, NotFound, StatusError
from loomfs.wire.status import Status

INDEX_END = 1 << 62
_ZEROS = bytes(1 << 20)


@dataclass(frozen=True, slots=True, order=True)
class ChunkKey:
    inode: int
    index: int

    def __str__(self) -> str:
        return f"{self.inode:x}/{self.index}"


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

    @property
    def has_pending(self) -> bool:
        return self.pending_ver > self.commit_ver


@dataclass(frozen=True, slots=True)
class Usage:
    used_bytes: int = 0
    chunk_count: int = 0
    capacity_bytes: int = 0


def crc_zeros(count: int, value: int = 0) -> int:
    """CRC32C of ``count`` zero bytes, continuing from ``value``."""
    while count > 0:
        step = min(count, len(_ZEROS))
        value = crc32c.crc32c(memoryview(_ZEROS)[:step], value)
        count -= step
    return value


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


class ChunkEngine(ABC):
    """Chunk storage for one target. Reads are synchronous (page cache); commit may fsync."""

    @abstractmethod
    def get(self, key: ChunkKey) -> ChunkState | None:
        """Current state of a chunk, or None when it has neither committed nor pending data."""

    @abstractmethod
    def read(self, key: ChunkKey, offset: int, into: memoryview, *, pending: bool = False) -> int:
        """Copy committed bytes [offset, offset+len(into)) into ``into``; returns bytes read
        (shorter at the end of the chunk). ``pending=True`` reads the pending update instead
        (re-forwarding). Raises NotFound when there is no such version."""

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
    ) -> ChunkState:
        """Stage update ``version``: the committed content with ``data`` written at ``offset``
        (a gap past the end reads as zeros), or exactly ``data`` when ``full_replace``."""

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
    ) -> ChunkState:
        """``stage_write`` that may run its disk write off the event loop."""
        return self.stage_write(key, version, offset, data, data_crc=data_crc, full_replace=full_replace)

    @abstractmethod
    def stage_truncate(self, key: ChunkKey, version: int, length: int) -> ChunkState:
        """Stage update ``version``: the committed content cut or zero-extended to ``length``."""

    @abstractmethod
    async def commit(self, key: ChunkKey, version: int) -> ChunkState:
        """Make pending ``version`` the committed one (durably when the engine fsyncs)."""

    @abstractmethod
    def abort(self, key: ChunkKey) -> None:
        """Drop the pending update, if any."""

    @abstractmethod
    async def remove_range(self, inode: int, index_begin: int = 0, index_end: int = INDEX_END) -> int:
        """Remove chunks [index_begin, index_end) of ``inode`` (committed and pending);
        returns how many chunks were removed."""

    @abstractmethod
    def list_chunks(
        self, inode: int = 0, index_begin: int = 0, index_end: int = INDEX_END, limit: int = 10000
    ) -> list[ChunkState]:
        """Chunks in (inode, index) order; ``inode=0`` lists all inodes (index range ignored)."""

    @abstractmethod
    def usage(self) -> Usage: ...

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release files; the engine is unusable afterwards."""
