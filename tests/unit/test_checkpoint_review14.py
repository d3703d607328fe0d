"""Three findings of the review of the checkpoint follow-ups (session 14), each failing on the
code before the fix. No sockets."""

from __future__ import annotations

import asyncio
import io
import threading
import time
import types
from typing import Any

import torch

from loomfs.checkpoint._heartbeat import Heartbeats
from loomfs.checkpoint._holds import ReadHolds
from loomfs.checkpoint._staging import Stager
from loomfs.checkpoint._writer import LoomStorageWriter
from loomfs.meta.paths import split_path


def _until(cond: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_a_heartbeat_whose_client_closed_does_not_hang_the_save() -> None:
    """A heartbeat write that raised anything but an OSError (a client closed mid-save:
    ValueError) left the beat 'writing' for ever: the save's stop() never returned."""

    class ClosedAfterOne:
        def __init__(self) -> None:
            self.opens = 0

        def open(self, path: str, mode: str) -> io.BytesIO:
            self.opens += 1
            if self.opens >= 2:
                raise ValueError("LoomFS client is closed")
            return io.BytesIO()

    fs = ClosedAfterOne()
    hb = Heartbeats()
    beat = hb.start(fs, "/run/.staging-x/.alive-rank-0", period_s=0.02)
    _until(lambda: fs.opens >= 2 and not beat.writing)
    t = threading.Thread(target=hb.stop, args=(beat,), daemon=True)
    t.start()
    t.join(10.0)
    assert not t.is_alive(), "stop() still waiting for a write that ended"


def test_read_holds_open_normal_paths() -> None:
    """The hold's OPEN sent the reader's path as given ("runs//exp/..."): meta takes normal
    absolute paths only, so every load of such a checkpoint path failed with EINVAL."""
    sent: list[str] = []

    class Meta:
        async def open(self, path: str, *args: Any, **kw: Any) -> Any:
            sent.append(path)
            split_path(path)  # what meta does with the request's path
            raise FileNotFoundError(path)  # enough: the path went out

    holds = ReadHolds(types.SimpleNamespace(meta=Meta(), client_id=1))
    try:
        asyncio.run(holds.open("runs//exp/step-1/__0_0.distcp"))
    except FileNotFoundError:
        pass
    assert sent == ["/runs/exp/step-1/__0_0.distcp"]


def test_a_planner_without_state_claims_no_staged_copy() -> None:
    """A planner that keeps no state_dict claimed the one staged copy, even another save's:
    the next stage then overwrote buffers that save was still reading."""
    st = Stager()
    w = LoomStorageWriter.__new__(LoomStorageWriter)
    w._staged = {}
    w._staged_lock = threading.Lock()
    w.stager = st
    staged, tok = st.stage({"a": torch.ones(4)})
    w._staged[tok] = frozenset([id(staged["a"])])  # an async save staged, not written yet

    class Stateless:
        pass

    assert w._claim_staged(Stateless()) is None
    st.stage({"a": torch.zeros(4)})  # another stage does not reuse the busy copy
    assert staged["a"].tolist() == [1.0] * 4


def test_a_forked_child_has_none_of_the_parents_heartbeats() -> None:
    """A DataLoader worker forked during a save inherited the parent's beats (and maybe a held
    lock): it would rewrite the parent's heartbeats, or deadlock on its first save."""
    import os

    from loomfs.checkpoint import _heartbeat

    class Fs:
        def open(self, path: str, mode: str) -> io.BytesIO:
            return io.BytesIO()

    beat = _heartbeat.DEFAULT_HEARTBEATS.start(Fs(), "/run/.staging-y/.alive-rank-0", period_s=60.0)
    try:
        pid = os.fork()
        if pid == 0:  # the child: report, never return into pytest
            hb = _heartbeat.DEFAULT_HEARTBEATS
            os._exit(0 if hb._beats == [] and hb._runner is None else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        _heartbeat.DEFAULT_HEARTBEATS.stop(beat)
