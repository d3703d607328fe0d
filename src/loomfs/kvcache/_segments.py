"""Append-only segment files: one writer (one ``AsyncKVCache``) appends to its own segment.

Values are packed back to back with no per-value header (the index entry holds the key,
length and CRC). A value that fits in a chunk but not in what is left of the current chunk
starts at the next chunk, so every such value is read with one chunk read; power-of-two
values fill chunks exactly. A segment is created as ``<writer>-<seq>.open``; when it reaches
``segment_bytes`` or is ``roll_s`` old the next put opens a new one and the old one is sealed
in the background: once the entries of every put into it are written, it is closed (its
length reported to meta) and renamed without ``.open``. Only sealed segments are compacted or
removed (an ``.open`` one only when it is so old that its writer must be gone), so a
compactor never removes a segment whose values' entries are still on their way. After a
failed write the segment is sealed the same way and the next append opens a new one, so a
torn region is never written over or pointed at.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
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


OPEN_SUFFIX = ".open"  # a segment still being appended to (or abandoned by a writer that died)


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
                 roll_s: float, monotonic_s: Callable[[], float] = time.monotonic):
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
        self._inflight: dict[int, int] = {}  # segment seq -> puts whose entries are not written yet
        self._settled = asyncio.Condition()
        self._retiring: set[asyncio.Task[None]] = set()  # segments being sealed
        self.segments_opened = 0
        self.segments_sealed = 0
        self.bytes_appended = 0
        self.abandoned = 0

    @property
    def current(self) -> str | None:
        """The name of the segment being appended to (None: none open)."""
        return segment_name(self.writer_id, self._seq) if self._file is not None else None

    @contextlib.asynccontextmanager
    async def append(self, values: Sequence[memoryview]) -> AsyncIterator[list[Placed]]:
        """Append ``values`` to this writer's segment, wait until storage holds them all, and
        yield where they landed; the segment is not sealed (and so not compacted) until the
        block, which writes their entries, is done."""
        placed, seq = await self._append(values)
        try:
            yield placed
        finally:
            async with self._settled:
                left = self._inflight[seq] - 1
                if left:
                    self._inflight[seq] = left
                else:
                    del self._inflight[seq]
                self._settled.notify_all()

    async def _append(self, values: Sequence[memoryview]) -> tuple[list[Placed], int]:
        async with self._lock:
            f = await self._ready(sum(len(v) for v in values))
            seq = self._seq
            placed: list[Placed] = []
            chains = tuple(f.layout.chains)
            cs = f.layout.chunk_size
            name = segment_name(self.writer_id, seq)
            self._inflight[seq] = self._inflight.get(seq, 0) + 1
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
                async with self._settled:
                    self._inflight[seq] -= 1
                    if not self._inflight[seq]:
                        del self._inflight[seq]
                    self._settled.notify_all()
                self.abandoned += 1
                logger.warning("kvcache: segment %s abandoned after a failed write", f.path)
                self._retire()
                raise
            self.bytes_appended += sum(len(v) for v in values)
            return placed, seq

    async def _ready(self, incoming_bytes: int) -> AsyncFile:
        f = self._file
        if f is not None and self._pos > 0 and (
                self._pos + incoming_bytes > self.segment_bytes or self._mono() - self._opened_s >= self.roll_s):
            self._retire()
            f = None
        if f is None:
            self._seq += 1
            path = f"{self.seg_dir}/{segment_name(self.writer_id, self._seq)}{OPEN_SUFFIX}"
            f = await self.client.open(path, "xb")
            if f.inline or not f.layout.chains:
                await f.close()
                raise LoomError(f"{path}: segment is not stored in chunks (the directory's inline limit)")
            self._file, self._pos, self._opened_s = f, 0, self._mono()
            self.segments_opened += 1
        return f

    def _retire(self) -> None:
        """Stop appending to the open segment; seal it in the background once the entries of
        every put into it are written."""
        f, self._file = self._file, None
        if f is None:
            return
        task = asyncio.get_running_loop().create_task(self._seal(f, self._seq))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _seal(self, f: AsyncFile, seq: int) -> None:
        """Close the segment (its length goes to meta), then drop the ``.open`` suffix: from
        then on compaction may move its values and remove it."""
        async with self._settled:
            await self._settled.wait_for(lambda: seq not in self._inflight)
        try:
            await f.close()
        except (LoomError, OSError) as exc:
            logger.warning("kvcache: closing segment %s: %s", f.path, exc)
        name = segment_name(self.writer_id, seq)
        try:
            await self.client.rename(f"{self.seg_dir}/{name}{OPEN_SUFFIX}", f"{self.seg_dir}/{name}")
            self.segments_sealed += 1
        except (LoomError, OSError) as exc:
            logger.warning("kvcache: sealing segment %s: %s", name, exc)

    async def roll_if_old(self) -> None:
        """Seal the open segment once it is ``roll_s`` old (the background task calls this,
        so an idle writer's segment becomes eligible for compaction)."""
        if self._file is None or self._lock.locked():
            return
        async with self._lock:
            if self._file is not None and self._mono() - self._opened_s >= self.roll_s:
                self._retire()

    async def close(self) -> None:
        async with self._lock:
            self._retire()
        while self._retiring:
            await asyncio.gather(*list(self._retiring), return_exceptions=True)

    def __repr__(self) -> str:
        return (f"SegmentWriter({self.seg_dir} writer={self.writer_id:#x} seg={self._seq} pos={self._pos} "
                f"opened={self.segments_opened} sealed={self.segments_sealed} abandoned={self.abandoned})")
