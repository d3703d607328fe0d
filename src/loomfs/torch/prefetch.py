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
    of the previous one is dropped). An error while reading (missing file...) ends the
    thread; it is raised from ``blocks`` of the range it belongs to, or, when it came from
    the dropped rest of an earlier range, from the ``blocks`` call that finds it; every
    later call raises it again. ``close()`` stops the thread (also when the consumer stops
    early).
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
        self._error: BaseException | None = None  # what ended the thread
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
                self._error = exc
                self._put((i, exc))
                return
            if not self._put((i, None)):
                return

    def _get(self) -> tuple[int, bytes | BaseException | None]:
        """The next item; never waits on a thread that has ended."""
        while True:
            try:
                return self._q.get(timeout=PUT_POLL_S)
            except queue.Empty:
                if self._thread.is_alive():
                    continue
            try:  # the thread's last put may have landed after the timeout
                return self._q.get_nowait()
            except queue.Empty:
                pass
            if self._error is not None:
                raise self._error
            raise RuntimeError(f"{self!r}: the prefetch thread has stopped")

    def blocks(self, i: int) -> Iterator[bytes]:
        if i != self._next:
            raise RuntimeError(f"ranges are read in order: asked for {i}, next is {self._next}")
        if not 0 <= i < len(self._ranges):
            raise IndexError(f"range {i} of {len(self._ranges)}")
        self._next += 1
        while True:
            j, item = self._get()
            if isinstance(item, BaseException):  # never dropped, even from an earlier range
                raise item
            if j < i:  # the rest of a range whose parser stopped early (bytes after a tar's end)
                continue
            if item is None:
                return
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
