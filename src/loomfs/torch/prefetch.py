"""``Prefetcher``: one background thread reads a list of byte ranges, in order, into a
bounded queue of blocks, so the next shard is already arriving while the current one is parsed.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from loomfs.shards.reader import BLOCK_BYTES, file_blocks
from loomfs.shards.store import Store

PUT_POLL_S = 0.05  # how often a blocked reader checks whether the consumer went away


@dataclass(frozen=True, slots=True)
class Range:
    path: str
    start: int = 0
    end: int | None = None  # None: to the end of the file


class Prefetcher:
    """Reads ``ranges`` on a daemon thread, at most ``max_bytes`` ahead of the consumer.

    ``blocks(i)`` yields range ``i``'s bytes; ranges are taken in order (what a parser left
    of the previous one is dropped). An error
    while reading (missing file...) is raised from ``blocks`` of the range it belongs to.
    ``close()`` stops the thread (also when the consumer stops early).
    """

    def __init__(self, store: Store, ranges: list[Range], *, max_bytes: int = 64 << 20,
                 block_bytes: int = BLOCK_BYTES):
        self._store = store
        self._ranges = ranges
        self._block = block_bytes
        self._q: queue.Queue[tuple[int, bytes | BaseException | None]] = queue.Queue(
            maxsize=max(2, max_bytes // block_bytes))
        self._stop = threading.Event()
        self._next = 0
        self.bytes_read = 0
        self._thread = threading.Thread(target=self._run, name="loomfs-prefetch", daemon=True)
        self._thread.start()

    def _put(self, item: tuple[int, bytes | BaseException | None]) -> bool:
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=PUT_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        for i, r in enumerate(self._ranges):
            try:
                with self._store.open_read(r.path) as f:
                    for block in file_blocks(f, r.start, r.end, self._block):
                        self.bytes_read += len(block)
                        if not self._put((i, block)):
                            return
            except BaseException as exc:  # handed to the consumer, who raises it
                if isinstance(exc, OSError) and not exc.filename:
                    exc.filename = self._store.url(r.path)
                self._put((i, exc))
                return
            if not self._put((i, None)):
                return

    def blocks(self, i: int) -> Iterator[bytes]:
        if i != self._next:
            raise RuntimeError(f"ranges are read in order: asked for {i}, next is {self._next}")
        self._next += 1
        while True:
            j, item = self._q.get()
            if j < i:  # the rest of a range whose parser stopped early (bytes after a tar's end)
                continue
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        self._stop.set()
        while True:  # unblock a reader waiting on a full queue
            try:
                self._q.get_nowait()
            except queue.Empty:
                break
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=10.0)

    def __repr__(self) -> str:
        return f"Prefetcher(ranges={len(self._ranges)} next={self._next} read={self.bytes_read})"
