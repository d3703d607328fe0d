"""Large payloads received off the event loop, on a few receive threads.

A profile of a 1 GiB read put the client's event-loop thread at its limit: the kernel's copy
out of the socket (``recv_into``) was 53 % of its busy time and the payload CRC32C 16 %. Both
release the GIL, so a frame's big payload is handed to a small pool of receive threads
(``BulkReceiver``): the loop parses the frame header, pauses reading that connection, and a
receive thread fills the destination buffer straight from the socket and hashes each piece
while it is cache-hot; then the loop finishes the frame and reads on. Replies from several
storage servers land on several cores at once; the loop thread only parses headers.

A job reads through its own ``dup`` of the socket (closed by the job itself, so the fd number
can never be reused under it) and waits in ``poll`` when the socket is empty. ``cancel``
(connection aborted or lost) shuts the socket down, which wakes the poll, and then waits for
the piece being received, so once it returns nothing writes into the destination any more:
a caller that timed out may reuse its buffer at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import select
import socket
import threading
from collections.abc import Callable

import crc32c

logger = logging.getLogger(__name__)

# payload bytes still to come for a frame to go to a receive thread: a hand-off costs the loop a
# pause/resume, a dup and a wake-up (~0.3 ms of CPU here), so payloads up to ~1.5 MiB are cheaper
# received on the loop (16 KiB KV gets in 1 MiB runs: client 16.9 vs 21.2 us CPU per value, 6
# pairs); whole 4 MiB chunks still go to threads ($LOOMFS_BULK_MIN for A/B)
BULK_MIN_BYTES = int(os.environ.get("LOOMFS_BULK_MIN", 1536 << 10))
PIECE_BYTES = 1 << 20  # received at a time at most (bounds cancel's wait)
# received bytes are hashed once this many are waiting (or at the end): each CRC call gives up and
# takes back the GIL, so hashing every recv (often ~300 KiB on loopback) costs thread switches;
# a step this size is still cache-hot ($LOOMFS_BULK_HASH_STEP for A/B)
HASH_STEP_BYTES = int(os.environ.get("LOOMFS_BULK_HASH_STEP", 1 << 20))
POLL_MS = 1000  # a poll wakes up this often anyway (cancel wakes it at once via shutdown)
THREADS_MAX = 4


class BulkJob:
    """Receive ``dest[pos:]`` from ``sock``, CRC32C continuing from ``acc``; ``done`` runs
    on ``loop`` when it ends (``error`` set when it failed or was cancelled)."""

    __slots__ = ("sock", "dest", "pos", "acc", "error", "cancelled", "lock", "loop", "done")

    def __init__(self, sock: socket.socket, dest: memoryview, pos: int, acc: int,
                 loop: asyncio.AbstractEventLoop, done: Callable[[BulkJob], None]):
        self.sock = sock
        self.dest = dest
        self.pos = pos
        self.acc = acc
        self.error: BaseException | None = None
        self.cancelled = False
        self.lock = threading.Lock()  # held while a piece is received into dest
        self.loop = loop
        self.done = done

    def cancel(self) -> None:
        """Stop receiving; when this returns the job writes no more bytes into ``dest``."""
        with self.lock:  # not inside a piece, and the socket is not being closed
            self.cancelled = True
            if self.sock.fileno() >= 0:
                try:
                    self.sock.shutdown(socket.SHUT_RDWR)  # wakes a poll in progress
                except OSError:
                    pass

    def run(self) -> None:
        fd = self.sock.fileno()
        total = len(self.dest)
        hashed = self.pos  # dest[hashed:pos] is received but not yet in acc
        try:
            poller = select.poll()
            poller.register(fd, select.POLLIN | select.POLLERR | select.POLLHUP)
            while self.pos < total:
                with self.lock:
                    if self.cancelled:
                        raise ConnectionAbortedError("receive cancelled")
                    end = min(total, self.pos + PIECE_BYTES)
                    try:
                        n = self.sock.recv_into(self.dest[self.pos : end])
                    except (BlockingIOError, InterruptedError):
                        n = -1
                    if n == 0:
                        raise ConnectionResetError("connection closed by peer mid-payload")
                    if n > 0:
                        self.pos += n
                        if self.pos - hashed >= HASH_STEP_BYTES or self.pos == total:
                            self.acc = crc32c.crc32c(self.dest[hashed : self.pos], self.acc)
                            hashed = self.pos
                if n < 0:
                    poller.poll(POLL_MS)
        except BaseException as exc:  # noqa: BLE001 - reported to the loop, which closes the connection
            self.error = exc
        finally:
            with self.lock:
                self.sock.close()
        try:
            self.loop.call_soon_threadsafe(self.done, self)
        except RuntimeError:  # the loop is closed: nobody waits for this payload any more
            pass


class BulkBusy(OSError):
    """Every receive thread is busy: the caller receives this payload on its loop instead (a
    job holds its thread until its payload is in, so a queued job could wait behind slow or
    stalled peers for as long as their calls' deadlines)."""


class BulkReceiver:
    """A pool of at most ``threads_max`` receive threads, started on demand (and again in a
    forked child, which inherits the pool but not its threads)."""

    def __init__(self, threads_max: int = THREADS_MAX):
        self.threads_max = max(1, threads_max)
        self._lock = threading.Lock()
        self._reset()
        self.jobs_total = 0
        self.busy_total = 0  # payloads received on the loop because every thread was busy

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._queue: queue.SimpleQueue[BulkJob] = queue.SimpleQueue()
        self._threads = 0
        self._idle = 0

    def start(self, sock: socket.socket, dest: memoryview, pos: int, acc: int,
              done: Callable[[BulkJob], None]) -> BulkJob:
        """Receive the rest of ``dest`` (from ``pos``) on a receive thread, through a dup of
        ``sock``; ``done(job)`` runs on the running loop when it ends."""
        job = BulkJob(sock.dup(), dest, pos, acc, asyncio.get_running_loop(), done)
        with self._lock:
            if self._pid != os.getpid():
                self._reset()
            if self._idle > 0:
                self._idle -= 1  # taken by a waiting thread
            elif self._threads >= self.threads_max:
                self.busy_total += 1
                job.sock.close()
                raise BulkBusy(f"all {self.threads_max} receive threads busy")
            else:
                try:
                    threading.Thread(target=self._work, args=(self._queue,), name=f"loomfs-recv-{self._threads + 1}",
                                     daemon=True).start()
                except RuntimeError as exc:  # can't start new thread
                    job.sock.close()
                    raise OSError(f"no receive thread: {exc}") from exc
                self._threads += 1
            self.jobs_total += 1
            self._queue.put(job)
        return job

    def _work(self, jobs: queue.SimpleQueue[BulkJob]) -> None:
        while True:
            job = jobs.get()
            job.run()
            with self._lock:
                if jobs is not self._queue:
                    return  # a pool of a parent process (fork): not ours
                self._idle += 1

    def __repr__(self) -> str:
        return (f"BulkReceiver(threads={self._threads}/{self.threads_max} jobs={self.jobs_total} "
                f"busy={self.busy_total})")


DEFAULT_BULK = BulkReceiver()


def _after_fork_in_child() -> None:
    """A forked child (DataLoader workers) starts with a fresh pool and lock: a parent thread
    may have held the lock at the fork, and none of its threads exist here."""
    DEFAULT_BULK._lock = threading.Lock()
    DEFAULT_BULK._reset()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
