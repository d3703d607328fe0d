"""Staging GC by heartbeat (review of 1cf28ef, finding 2): on LoomFS a file being written shows
other clients no new mtime until its close, nor does its directory, so 1cf28ef's "untouched for
an hour" rule deleted a save that was still writing. ``FrozenMtimeFS`` shows mtimes that way;
time is a fake clock, no sleeps. The save-in-progress test failed on 1cf28ef."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from test_checkpoint_save_races import LocalFS, _File
from torch.distributed.checkpoint import DefaultSavePlanner
from torch.distributed.checkpoint.planner import WriteItem

from loomfs.checkpoint import LoomStorageWriter, list_checkpoints
from loomfs.checkpoint import _layout as L
from loomfs.checkpoint._heartbeat import Heartbeats
from loomfs.checkpoint._writer import gc_staging

HOUR_S = 3600.0


class FrozenMtimeFS(LocalFS):
    """A file's mtime moves at its close only (on the fake clock); a directory's at its
    creation only: what another client of LoomFS sees of a save in progress."""

    def __init__(self, root: Path, clock: list[float]):
        super().__init__(root)
        self.clock = clock
        self.mtimes: dict[str, float] = {}

    def mkdir(self, path: str) -> None:
        super().mkdir(path)
        self.mtimes[path.rstrip("/")] = self.clock[0]

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        super().makedirs(path, exist_ok=exist_ok)
        self.mtimes.setdefault(path.rstrip("/"), self.clock[0])

    def open(self, path: str, mode: str = "rb") -> _File:
        f = super().open(path, mode)
        if "w" in mode:
            self.mtimes.setdefault(path, self.clock[0])  # created: shown as of now, then frozen
            real_close = f.close

            def close() -> None:
                real_close()
                self.mtimes[path] = self.clock[0]

            f.close = close  # type: ignore[method-assign]
        return f

    def stat(self, path: str) -> Any:
        st = super().stat(path)
        return SimpleNamespace(st_mtime=self.mtimes.get(path.rstrip("/"), st.st_mtime), st_size=st.st_size)

    def rename(self, src: str, dst: str, **kw: Any) -> None:
        super().rename(src, dst, **kw)
        for k in [k for k in self.mtimes if k == src or k.startswith(src + "/")]:
            self.mtimes[dst + k[len(src):]] = self.mtimes.pop(k)


def test_gc_leaves_a_save_that_writes_for_hours(tmp_path: Path) -> None:
    clock = [1_000_000.0]
    fs = FrozenMtimeFS(tmp_path, clock)
    fs.makedirs("/run")
    beats = Heartbeats(clock=lambda: clock[0], thread=False)
    removed: list[list[str]] = []

    class SlowPlanner(DefaultSavePlanner):
        """Two hours pass while the first item is written (its file open, so no mtime moves);
        the heartbeat ticks each minute meanwhile; then another save's commit runs its gc."""

        def resolve_data(self, write_item: WriteItem) -> Any:
            if not removed:
                for _ in range(120):
                    clock[0] += L.HEARTBEAT_S
                    beats.beat_due()
                removed.append(gc_staging(fs, "/run", 5, now=clock[0]))
            return super().resolve_data(write_item)

    w = LoomStorageWriter("/run", fs, step=1, heartbeats=beats)
    dcp.save({"w": torch.ones(8)}, storage_writer=w, planner=SlowPlanner(), no_dist=True)
    assert removed == [[]]
    (ck,) = list_checkpoints(fs, "/run")
    assert ck.complete and not [n for n in fs.listdir(ck.path) if n.startswith(L.HEARTBEAT_PREFIX)]
    assert not beats._beats  # stopped when the save's writes ended


def test_gc_removes_a_staging_dir_whose_heartbeat_stopped(tmp_path: Path) -> None:
    clock = [1_000_000.0]
    fs = FrozenMtimeFS(tmp_path, clock)
    fs.makedirs("/run")
    beats = Heartbeats(clock=lambda: clock[0], thread=False)
    dead, live, old = (L.staging_name(L.step_name(1)) for _ in range(3))
    for name in (dead, live, old):
        fs.mkdir(f"/run/{name}")
    dead_beat = beats.start(fs, f"/run/{dead}/{L.heartbeat_name(0)}")
    beats.start(fs, f"/run/{live}/{L.heartbeat_name(0)}")
    dead_beat.stop()  # its rank crashed (or failed) here
    for _ in range(61):
        clock[0] += L.HEARTBEAT_S
        beats.beat_due()
    # ``old``: no heartbeat (a save from before them), nothing touched for an hour: the old rule
    assert sorted(gc_staging(fs, "/run", 5, now=clock[0])) == sorted([dead, old])
    assert [n for n in fs.listdir("/run")] == [live]


def test_the_heartbeat_thread_rewrites_when_due(tmp_path: Path) -> None:
    fs = LocalFS(tmp_path)
    fs.makedirs("/s")
    beats = Heartbeats(thread=True)
    beat = beats.start(fs, "/s/.alive-rank-0", period_s=0.01)
    try:
        with beats._cv:  # the thread's rewrites: a wait on its condition, not a fixed sleep
            assert beats._cv.wait_for(lambda: beats.written_total >= 3, timeout=30), beats
    finally:
        beat.stop()
    n = beats.written_total
    assert not beat.writing and beats.written_total == n  # stopped: no rewrite after stop returned
    assert os.path.exists(fs._p("/s/.alive-rank-0"))
