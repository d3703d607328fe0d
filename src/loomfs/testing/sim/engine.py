"""Disk faults for the simulator: a MemoryEngine that fails, rots, tears and reports.

``FaultyEngine`` is the in-memory engine (its crash semantics: a crash loses every pending
update, nothing committed) plus seeded faults the simulator switches on and off:

* ``eio_rate`` / ``enospc``: a stage (write or truncate) fails with EIO at that rate, or always
  with ENOSPC (a full disk), before anything is staged;
* ``flip``: one byte of a committed chunk flips, no CRC updated (bit rot: reads and the
  scrubber must notice it);
* ``crash(tear=True)``: besides losing pending updates, the chunk committed last gets a torn
  tail (part of its newest bytes did not reach the disk before power went, its CRC did);
* ``wipe``: a replaced disk: the target comes back empty (same id) after its process restarts,
  with a new format id (``storage.diskident``: what tells mgmtd the disk is not the old one);
* ``lose_pages``: after a failed fsync, the pages of one committed chunk are lost (its bytes
  rot); ``marker_refused``: the next process is not told to verify (only mgmtd remembers);
* ``down``: the process is dead; any call raises EIO (so a task that outlives its crash by a
  few steps cannot change the disk).

It also tells an ``EngineObserver`` about every commit and every committed read it serves,
which is how the simulator checks that a version names one content cluster-wide.
"""

from __future__ import annotations

import errno
import random
from collections.abc import Callable
from typing import Any, Protocol

from loomfs.storage.engine.chunkmap import ChunkMap
from loomfs.storage.engine.memory import MemoryEngine
from loomfs.storage.engine.types import ChunkKey, ChunkState

TEAR_BYTES_MAX = 64


class EngineObserver(Protocol):
    def on_commit(self, target_id: int, st: ChunkState) -> None: ...

    def on_serve(self, target_id: int, st: ChunkState) -> None: ...


class FaultyEngine(MemoryEngine):
    def __init__(self, target_id: int, rng: random.Random, observer: EngineObserver | None = None,
                 capacity_bytes: int = 1 << 40):
        super().__init__(capacity_bytes=capacity_bytes)
        self.target_id = target_id
        self.rng = rng
        self.observer = observer
        self.eio_rate = 0.0
        self.enospc = False
        self.down = False
        self.stage_faults = 0
        self.flips = 0
        self.tears = 0
        self.lost_pages = 0
        self.wipes = 0
        self.last_torn: ChunkKey | None = None
        # called once, right after the next commit or committed read (op is "commit" or "read")
        self.after_io: Callable[[str, ChunkKey], None] | None = None
        self._last_commit: tuple[ChunkKey, int] | None = None  # (chunk, bytes its update wrote)
        self.format_id = ""  # the disk's identity (the cluster sets it; a wipe gives a new one)

    def _alive(self) -> None:
        if self.down:
            raise OSError(errno.EIO, f"sim: target {self.target_id} is down (its process crashed)")

    def _stage_fault(self) -> None:
        self._alive()
        if self.enospc:
            self.stage_faults += 1
            raise OSError(errno.ENOSPC, f"sim: target {self.target_id}: no space left on device")
        if self.eio_rate and self.rng.random() < self.eio_rate:
            self.stage_faults += 1
            raise OSError(errno.EIO, f"sim: target {self.target_id}: I/O error on write")

    # ---- the engine calls the simulator intercepts -------------------------------------------
    def get(self, key: ChunkKey) -> ChunkState | None:
        self._alive()
        return super().get(key)

    def read(self, key: ChunkKey, offset: int, into: memoryview, *, pending: bool = False) -> int:
        self._alive()
        n = super().read(key, offset, into, pending=pending)
        if not pending:
            self._after("read", key)  # e.g. frozen between reading a chunk and sending it (resync)
        return n

    async def aread(self, key: ChunkKey, offset: int, into: memoryview) -> int:
        self._alive()
        st = super().get(key)
        if st is not None and st.commit_ver and self.observer is not None:
            self.observer.on_serve(self.target_id, st)
        return self.read(key, offset, into)

    def stage_write(self, key: ChunkKey, version: int, *args: Any, **kwargs: Any) -> ChunkState:
        self._stage_fault()
        return super().stage_write(key, version, *args, **kwargs)

    def stage_truncate(self, key: ChunkKey, version: int, *args: Any, **kwargs: Any) -> ChunkState:
        self._stage_fault()
        return super().stage_truncate(key, version, *args, **kwargs)

    async def commit(self, key: ChunkKey, version: int, *args: Any, **kwargs: Any) -> ChunkState:
        self._alive()
        before = super().get(key)
        st = await super().commit(key, version, *args, **kwargs)
        old_len = before.length if before is not None else 0
        self._last_commit = (key, max(1, st.length - old_len) if st.length > old_len else st.length)
        if self.observer is not None:
            self.observer.on_commit(self.target_id, st)
        self._after("commit", key)  # e.g. the process dies right after this commit reached the disk
        return st

    def _after(self, op: str, key: ChunkKey) -> None:
        hook, self.after_io = self.after_io, None
        if hook is not None:
            hook(op, key)

    def list_chunks(self, *args: Any, **kwargs: Any) -> list[ChunkState]:
        self._alive()
        return super().list_chunks(*args, **kwargs)

    async def remove_range(self, inode: int, *args: Any, **kwargs: Any) -> int:
        self._alive()
        return await super().remove_range(inode, *args, **kwargs)

    # ---- faults ------------------------------------------------------------------------------
    def flip(self) -> tuple[ChunkKey, int] | None:
        """Flip one committed byte of a random chunk; returns (chunk, offset) or None."""
        chunks = [s for s in super().list_chunks(0, limit=1 << 20) if s.commit_ver and s.length]
        if not chunks:
            return None
        st = chunks[self.rng.randrange(len(chunks))]
        offset = self.rng.randrange(st.length)
        self.corrupt(st.key, offset)
        self.flips += 1
        return st.key, offset

    def crash(self, *, tear: bool = False) -> None:
        """Power loss: pending updates are lost; with ``tear`` the newest commit's last bytes
        are garbled (the index row reached the disk, part of the data did not): the torn chunk
        is left in ``last_torn``."""
        super().crash()
        torn = None
        if tear and self._last_commit is not None:
            key, written = self._last_commit
            st = super().get(key)
            if st is not None and st.commit_ver and st.length:
                span = min(st.length, written, 1 + self.rng.randrange(TEAR_BYTES_MAX))
                for off in range(st.length - span, st.length):
                    self.corrupt(key, off)
                self.tears += 1
                torn = key
        self._last_commit = None
        self.last_torn = torn

    def lose_pages(self, rng: random.Random) -> ChunkKey | None:
        """A failed fsync lost the pages of one committed chunk (a plain commit only the page
        cache held): its bytes rot, its row stands. The next process's verification must find
        it. ``rng``: a stream of its own (this engine's draws stay as they were)."""
        chunks = [s for s in super().list_chunks(0, limit=1 << 20) if s.commit_ver and s.length]
        if not chunks:
            return None
        lost = chunks[rng.randrange(len(chunks))]
        self.corrupt(lost.key, rng.randrange(lost.length))
        self.lost_pages += 1
        return lost.key

    def wipe(self, format_id: str = "") -> int:
        """A replaced disk (while the process is down): every chunk gone, committed or not; the
        target comes back empty under the same id, with ``format_id`` (the new disk's identity).
        Returns how many chunks it held."""
        held = len(super().list_chunks(0, limit=1 << 20))
        self.format_id = format_id
        self._slots = ChunkMap()
        self._used_bytes = self._committed = 0
        self._durable_pending.clear()
        self.suspect_chunks = []
        self._last_commit = None
        self.wipes += 1
        return held

    def bad_chunks(self) -> list[ChunkKey]:
        """Committed chunks whose bytes do not match their block CRCs."""
        out = []
        for st in super().list_chunks(0, limit=1 << 20):
            if st.commit_ver and self.verify(st.key):
                out.append(st.key)
        return out

    def __repr__(self) -> str:
        return (f"FaultyEngine(target={self.target_id} down={self.down} eio={self.eio_rate} enospc={self.enospc} "
                f"flips={self.flips} tears={self.tears} {super().__repr__()})")
