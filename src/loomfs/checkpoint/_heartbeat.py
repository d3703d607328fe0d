"""Heartbeats: a save in progress says so in its staging directory. No torch import.

Staging directories of crashed saves are deleted once they look abandoned (``gc_staging``,
``prune``). Their mtimes cannot tell: on LoomFS a file being written shows other clients no
new mtime or size until its close, nor does its directory, and a tiered save waiting in the
upload queue touches nothing at all. So each saving rank keeps a small heartbeat file in the
staging directory (``.alive-rank-N``; the coordinator's tiered commit ``.alive-commit``) that
it rewrites, a whole small file closed each time, every ``HEARTBEAT_S`` while its part of the
save runs: from ``write_data`` to its end (a tiered save: to the end of the rank's upload),
and for a tiered commit while it waits in the queue and for the ranks' markers. A staging
directory is abandoned when its newest heartbeat is older than the age threshold
(``_layout.staging_idle_s``). A rank stops its heartbeat (waiting for a rewrite in flight)
before the save goes on, so the commit can remove the files and none comes back.

One daemon thread per process rewrites every live heartbeat when due (``Heartbeats``); the
cost is one small put per saving rank per ``HEARTBEAT_S`` (60 s).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from loomfs.checkpoint import _layout as L

logger = logging.getLogger(__name__)


class Beat:
    """One heartbeat file, rewritten every ``period_s`` until ``stop``."""

    __slots__ = ("owner", "fs", "path", "period_s", "due", "stopped", "writing")

    def __init__(self, owner: Heartbeats, fs: Any, path: str, period_s: float, due: float):
        self.owner = owner
        self.fs = fs
        self.path = path
        self.period_s = period_s
        self.due = due  # the owner's clock
        self.stopped = False
        self.writing = False

    def __repr__(self) -> str:
        return f"Beat({self.path!r}, period_s={self.period_s}, stopped={self.stopped})"

    def stop(self) -> None:
        self.owner.stop(self)


def write_beat(fs: Any, path: str) -> None:
    """(Re)write the heartbeat file ``path``: a whole file, closed (its mtime then moves)."""
    with fs.open(path, "wb") as f:
        f.write(f"{time.time():.3f}\n".encode())


class Heartbeats:
    """The live heartbeats of this process, rewritten by one daemon thread when due (or by
    ``beat_due``, which tests call with ``thread=False``)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, thread: bool = True):
        self.clock = clock
        self.thread = thread
        self._beats: list[Beat] = []
        self._cv = threading.Condition()
        self._runner: threading.Thread | None = None
        self.written_total = 0

    def __repr__(self) -> str:
        return f"Heartbeats(live={len(self._beats)} written={self.written_total})"

    def start(self, fs: Any, path: str, period_s: float = L.HEARTBEAT_S) -> Beat:
        """Write ``path`` now (the save is seen alive from here on) and every ``period_s``."""
        write_beat(fs, path)
        beat = Beat(self, fs, path, period_s, self.clock() + period_s)
        with self._cv:
            self.written_total += 1
            self._beats.append(beat)
            if self.thread and (self._runner is None or not self._runner.is_alive()):
                self._runner = threading.Thread(target=self._run, name="loomfs-ckpt-heartbeat", daemon=True)
                self._runner.start()
            self._cv.notify_all()
        return beat

    def stop(self, beat: Beat) -> None:
        """No more rewrites of ``beat``; returns once a rewrite in flight is done."""
        with self._cv:
            beat.stopped = True
            if beat in self._beats:
                self._beats.remove(beat)
            while beat.writing:
                self._cv.wait()
            self._cv.notify_all()

    def beat_due(self) -> int:
        """Rewrite every heartbeat that is due; how many were written."""
        with self._cv:
            now = self.clock()
            due = [b for b in self._beats if b.due <= now]
            for b in due:
                b.writing = True
        written = 0
        for b in due:
            ok = False
            try:
                write_beat(b.fs, b.path)
                ok = True
            except FileNotFoundError:  # the staging directory went (committed, or deleted): done
                logger.info("checkpoint heartbeat %s: its directory is gone", b.path)
                b.stopped = True
            except OSError as exc:  # next period (the age threshold is many periods)
                logger.warning("checkpoint heartbeat %s: %s", b.path, exc)
            except Exception as exc:  # e.g. the client closed mid-save: this beat is over
                logger.warning("checkpoint heartbeat %s stops: %r", b.path, exc)
                b.stopped = True
            finally:  # whatever happened, ``stop`` must not wait for this write for ever
                written += ok
                with self._cv:
                    b.writing = False
                    b.due = now + b.period_s
                    if b.stopped and b in self._beats:
                        self._beats.remove(b)
                    self.written_total += ok
                    self._cv.notify_all()
        return written

    def _run(self) -> None:
        while True:
            with self._cv:
                if not self._beats:
                    self._runner = None
                    return
                wait_s = min(b.due for b in self._beats) - self.clock()
                if wait_s > 0:
                    self._cv.wait(wait_s)
                    continue
            self.beat_due()


DEFAULT_HEARTBEATS = Heartbeats()


def _after_fork_in_child() -> None:
    """A forked child (a DataLoader worker) has none of the parent's saves: no beats of
    them, no thread, and a fresh lock (a parent thread may have held it at the fork)."""
    DEFAULT_HEARTBEATS._beats = []
    DEFAULT_HEARTBEATS._cv = threading.Condition()
    DEFAULT_HEARTBEATS._runner = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
