"""Background uploads of checkpoints first written to a local directory (NVMe).

``Uploader`` runs jobs on one thread, in order, with at most ``max_inflight`` checkpoints
pending (``submit`` blocks beyond that: backpressure on training instead of unbounded local
disk use). ``progress()`` reports bytes done per checkpoint; the first failure is logged and
raised by ``wait()``. Each rank uploads its files into the shared staging directory, fsyncs
them and writes a ``.rank-N.done`` marker; the coordinator's commit job polls (with a
deadline) until every rank's marker is there, then commits as a direct save does.
"""

from __future__ import annotations

import collections
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from typing import Any

from loomfs.checkpoint import _layout as L
from loomfs.checkpoint._format import PlanInfo
from loomfs.checkpoint._heartbeat import Beat

logger = logging.getLogger(__name__)
COPY_BLOCK_BYTES = 16 << 20
POLL_S = 0.05
Job = Callable[["Progress"], None]


def done_marker(rank: int) -> str:
    return f".rank-{rank}.done"


class Progress:
    def __init__(self, key: str):
        self.key = key
        self.bytes_done = 0
        self.bytes_total = 0
        self.error: BaseException | None = None
        self.done = False

    def __repr__(self) -> str:
        return f"Progress({self.key!r}, {self.bytes_done}/{self.bytes_total}, done={self.done})"


class Uploader:
    """One background thread running upload jobs in order; bounded checkpoints in flight."""

    def __init__(self, max_inflight: int = 2):
        self.max_inflight = max_inflight
        self._cv = threading.Condition()
        self._jobs: collections.deque[tuple[Job, Progress]] = collections.deque()
        self._pending: dict[str, int] = {}
        self._progress: dict[str, Progress] = {}
        self._errors: list[BaseException] = []
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"Uploader(pending={len(self._pending)}, errors={len(self._errors)})"

    def submit(self, job: Job, *, key: str) -> Progress:
        with self._cv:
            while key not in self._pending and len(self._pending) >= self.max_inflight:
                self._cv.wait()
            self._pending[key] = self._pending.get(key, 0) + 1
            prog = self._progress.setdefault(key, Progress(key))
            self._jobs.append((job, prog))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="loomfs-ckpt-upload", daemon=True)
                self._thread.start()
            self._cv.notify_all()
        return prog

    def _run(self) -> None:
        while True:
            with self._cv:
                if not self._jobs:
                    self._thread = None
                    return
                job, prog = self._jobs.popleft()
            try:
                job(prog)
            except BaseException as exc:  # reported by wait(), not lost on the thread
                logger.error("checkpoint upload %s failed: %s", prog.key, exc)
                prog.error = exc
                with self._cv:
                    self._errors.append(exc)
            with self._cv:
                self._pending[prog.key] -= 1
                if self._pending[prog.key] == 0:
                    del self._pending[prog.key]
                    prog.done = True
                self._cv.notify_all()

    def progress(self) -> list[Progress]:
        with self._cv:
            return list(self._progress.values())

    def wait(self, timeout_s: float | None = None) -> None:
        """Block until nothing is pending; raise the first upload error (once)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cv:
            while self._pending:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"checkpoint uploads still pending: {sorted(self._pending)}")
                self._cv.wait(left)
            if self._errors:
                err, self._errors = self._errors[0], []
                raise err

    flush = wait


def rank_upload_job(fs: Any, local: str, info: PlanInfo, names: list[str], beat: Beat | None = None) -> Job:
    """Copy a rank's files into the staging directory, then its marker. ``beat``: the rank's
    heartbeat, stopped when the copy ends (before the marker: the commit removes it)."""
    def job(prog: Progress) -> None:
        try:
            prog.bytes_total += sum(os.path.getsize(os.path.join(local, n)) for n in names)
            for name in names:
                with open(os.path.join(local, name), "rb") as src, fs.open(L.join(info.staging, name), "wb") as dst:
                    while True:
                        block = src.read(COPY_BLOCK_BYTES)
                        if not block:
                            break
                        dst.write(block)
                        prog.bytes_done += len(block)
                    dst.fsync()
        finally:
            if beat is not None:
                beat.stop()
        with fs.open(L.join(info.staging, done_marker(info.rank)), "wb") as f:
            f.write(b"done\n")
            f.fsync()
        shutil.rmtree(local, ignore_errors=True)  # this rank's own directory (rank-N)
        try:
            os.rmdir(os.path.dirname(local))  # the save's, once every rank of the host emptied it
        except OSError:
            pass

    return job


def commit_job(fs: Any, info: PlanInfo, blobs: dict[str, bytes], move_latest: bool, timeout_s: float,
               need: dict[str, int] | None = None, beat: Beat | None = None) -> Job:
    """Wait for every rank's marker, then commit. ``beat``: the commit's heartbeat, stopped
    before the commit (which removes the heartbeat files)."""
    def job(prog: Progress) -> None:
        from loomfs.checkpoint._writer import commit

        try:
            deadline = time.monotonic() + timeout_s
            markers = [L.join(info.staging, done_marker(r)) for r in range(info.world_size)]
            while not all(fs.exists(m) for m in markers):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{info.final}: not every rank uploaded within {timeout_s} s")
                time.sleep(POLL_S)
        finally:
            if beat is not None:
                beat.stop()
        commit(fs, info, blobs, move_latest, need)

    return job
