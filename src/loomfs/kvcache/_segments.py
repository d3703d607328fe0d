"""Append-only segment files: one writer (one ``AsyncKVCache``) appends to its own segment.

Values are packed back to back with no per-value header (the index entry holds the key,
length and CRC). A value that fits in a chunk but not in what is left of the current chunk
starts at the next chunk, so every such value is read with one chunk read; power-of-two
values fill chunks exactly. A segment is closed (its length reported to meta) and a new one
opened when it reaches ``segment_bytes`` or is ``roll_s`` old. After a failed write the
segment is abandoned (closed in the background) and the next append opens a new one, so a
torn region is never written over or pointed at.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from loomfs.errors import LoomError

if TYPE_CHECKING:
    from loomfs.client.core import AsyncClient
    from loomfs.client.file import AsyncFile

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Placed:
    """Where one appended value landed."""

    seg_name: str
    seg_inode: int
    offset: int
    chunk_size: int
    chains: tuple[int, ...]


def segment_name(writer_id: int, seq: int) -> str:
    return f"{writer_id:016x}-{seq:08d}"


def writer_of(name: str) -> int | None:
    """The writer id a segment name carries (None: not a segment name)."""
    head, sep, seq = name.partition("-")
    if not sep or len(head) != 16 or not seq.isdigit():
        return None
    try:
        return int(head, 16)
    except ValueError:
        return None


def aligned_offset(pos: int, nbytes: int, chunk_size: int) -> int:
    """Where a value of ``nbytes`` goes when the segment's end is ``pos``: at ``pos``, or at
    the next chunk boundary when it fits in one chunk but would cross one from ``pos``."""
    if 0 < nbytes <= chunk_size and pos % chunk_size + nbytes > chunk_size:
        return (pos // chunk_size + 1) * chunk_size
    return pos


class SegmentWriter:
    def __init__(self, client: AsyncClient, seg_dir: str, writer_id: int, *, segment_bytes: int,
                 roll_s: float, monotonic_s: object = time.monotonic):
        self.client = client
        self.seg_dir = seg_dir
        self.writer_id = writer_id
        self.segment_bytes = segment_bytes
        self.roll_s = roll_s
        self._mono = monotonic_s
        self._seq = 0
        self._file: AsyncFile | None = None
        self._opened_s = 0.0
        self._pos = 0
        self._lock = asyncio.Lock()
        self._closing: set[asyncio.Task[None]] = set()  # abandoned segments being closed
        self.segments_opened = 0
        self.bytes_appended = 0
        self.abandoned = 0

    @property
    def current(self) -> str | None:
        """The name of the segment being appended to (None: none open)."""
        return segment_name(self.writer_id, self._seq) if self._file is not None else None

    async def append_many(self, values: Sequence[memoryview]) -> list[Placed]:
        """Append ``values`` to this writer's segment and wait until storage holds them all."""
        async with self._lock:
            f = await self._ready(sum(len(v) for v in values))
            placed: list[Placed] = []
            chains = tuple(f.layout.chains)
            cs = f.layout.chunk_size
            name = segment_name(self.writer_id, self._seq)
            try:
                for v in values:
                    off = aligned_offset(self._pos, len(v), cs)
                    if off != self._pos:
                        await f.seek(off)
                    if len(v):
                        await f.write(v)
                    self._pos = off + len(v)
                    placed.append(Placed(name, f.inode, off, cs, chains))
                await f.flush()
            except BaseException:
                self._abandon()
                raise
            self.bytes_appended += sum(len(v) for v in values)
            return placed

    async def _ready(self, incoming_bytes: int) -> AsyncFile:
        f = self._file
        if f is not None and self._pos > 0 and (
                self._pos + incoming_bytes > self.segment_bytes or self._mono() - self._opened_s >= self.roll_s):  # type: ignore[operator]
            await self._seal()
            f = None
        if f is None:
            self._seq += 1
            path = f"{self.seg_dir}/{segment_name(self.writer_id, self._seq)}"
            f = await self.client.open(path, "xb")
            if f.inline or not f.layout.chains:
                await f.close()
                raise LoomError(f"{path}: segment is not stored in chunks (the directory's inline limit)")
            self._file, self._pos, self._opened_s = f, 0, self._mono()  # type: ignore[operator]
            self.segments_opened += 1
        return f

    async def _seal(self) -> None:
        f, self._file = self._file, None
        if f is not None:
            try:
                await f.close()
            except (LoomError, OSError) as exc:
                logger.warning("kvcache: closing segment %s: %s", f.path, exc)

    def _abandon(self) -> None:
        f, self._file = self._file, None
        if f is None:
            return
        self.abandoned += 1
        logger.warning("kvcache: segment %s abandoned after a failed write", f.path)
        task = asyncio.get_running_loop().create_task(self._close_quietly(f))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    @staticmethod
    async def _close_quietly(f: AsyncFile) -> None:
        try:
            await f.close()
        except (LoomError, OSError) as exc:
            logger.debug("kvcache: closing abandoned segment %s: %s", f.path, exc)

    async def roll_if_old(self) -> None:
        """Seal the open segment once it is ``roll_s`` old (the background task calls this,
        so an idle writer's segment becomes eligible for compaction)."""
        if self._file is None or self._lock.locked():
            return
        async with self._lock:
            if self._file is not None and self._mono() - self._opened_s >= self.roll_s:  # type: ignore[operator]
                await self._seal()

    async def close(self) -> None:
        async with self._lock:
            await self._seal()
        if self._closing:
            await asyncio.gather(*list(self._closing), return_exceptions=True)

    def __repr__(self) -> str:
        return (f"SegmentWriter({self.seg_dir} writer={self.writer_id:#x} seg={self._seq} pos={self._pos} "
                f"opened={self.segments_opened} abandoned={self.abandoned})")
