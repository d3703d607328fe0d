"""Hunt 16 (meta removes or cuts data it must keep): trims. A model of the chunks stands in for
storage (``test_meta_trim.Chunks``); SQLite in memory, ManualClock, no sockets."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from test_meta_namespace import CREAT, Env
from test_meta_trim import Chunks, _with_trimmer

from loomfs.meta.store.base import TrimEntry
from loomfs.meta.trim import merge
from loomfs.wire.types import Layout

W = os.O_WRONLY


@pytest.fixture
def env() -> Iterator[Env]:
    e = Env()
    yield e
    e.close()


def test_a_size_set_under_writers_does_not_cut_at_a_pending_idle_trims_length(env: Env) -> None:
    """A stale writer's tail is queued as an idle trim at the length then (0), cut at the file's
    length once no writer is open. A size set while a current writer is open (an extend, for
    meta) is a shrink at the new size: the current writer's unreported bytes below it stay
    (``test_size_sets_under_open_writers_are_shrinks``). Merged into the idle entry it took the
    idle entry's length (the lowest), so the cut fell at 0 and erased the current writer's
    bytes below the size just set."""
    chunks = Chunks()
    _with_trimmer(env, chunks)
    stale = env.run(env.ns.open("/f", CREAT, client_id=1))
    ino = stale.attr.inode
    env.run(env.ns.setattr("/f", size=0))  # the stale writer has not heard of it
    fresh = env.run(env.ns.open("/f", W, client_id=2))
    chunks.write(ino, 0, b"fresh!")  # current epoch, not yet reported
    chunks.write(ino, 100, b"stale")
    env.run(env.ns.close(ino, stale.session_id, 105, trunc_epoch=stale.trunc_epoch))  # idle trim at 0
    r = env.run(env.ns.setattr("/f", size=50))  # a third client sets the size while fresh is open
    assert r.attr.size == 50
    assert chunks.read(ino, 0, 6) == b"fresh!", "the size set cut the current writer's bytes below it"
    assert chunks.read(ino, 50, 60) == bytes(60)  # what lay past the size is cut (the stale tail too)
    env.run(env.ns.close(ino, fresh.session_id, 6, trunc_epoch=fresh.trunc_epoch))
    assert env.run(env.ns.stat("/f")).size == 50
    assert chunks.read(ino, 0, 105) == b"fresh!" + bytes(99)


def test_a_shrink_keeps_reported_bytes_below_it_while_an_idle_trim_waits(env: Env) -> None:
    """The same merge, with no extend: an idle trim waits (a writer is still open) at the
    length the file had when the stale report came (0); a current writer then reports 12 bytes
    and closes; a truncate to 8 must keep 8 of them (it cut at 0)."""
    chunks = Chunks()
    _with_trimmer(env, chunks)
    stale = env.run(env.ns.open("/f", CREAT, client_id=1))
    ino = stale.attr.inode
    env.run(env.ns.setattr("/f", size=0))
    fresh = env.run(env.ns.open("/f", W, client_id=2))
    idle_writer = env.run(env.ns.open("/f", W, client_id=3))  # open, writes nothing: keeps the trim idle
    chunks.write(ino, 200, b"stale")
    env.run(env.ns.close(ino, stale.session_id, 205, trunc_epoch=stale.trunc_epoch))  # idle trim at 0
    chunks.write(ino, 0, b"fresh data!!")
    env.run(env.ns.close(ino, fresh.session_id, 12, trunc_epoch=fresh.trunc_epoch))
    assert env.run(env.ns.stat("/f")).size == 12
    env.run(env.ns.setattr("/f", size=8))
    assert chunks.read(ino, 0, 12) == b"fresh da" + bytes(4), "the truncate to 8 cut reported bytes below 8"
    env.run(env.ns.close(ino, idle_writer.session_id, -1, trunc_epoch=idle_writer.trunc_epoch))
    assert env.run(env.ns.stat("/f")).size == 8
    assert chunks.read(ino, 0, 205) == b"fresh da" + bytes(197)


def test_merge_of_a_shrink_into_an_idle_entry_cuts_at_the_shrinks_length() -> None:
    lay = Layout(chains=[1])
    idle = TrimEntry(inode=5, layout=lay, length=10, old_length=400, idle=True, generation=1, enqueued_ns=1)
    # the shrink sets the file's length to its own: the idle cut (at max(its length, the
    # file's length)) would fall there too, never below
    up = merge(idle, TrimEntry(inode=5, layout=lay, length=200, old_length=10, idle=False, generation=0,
                               enqueued_ns=2), 3)
    assert (up.length, up.old_length, up.idle, up.generation) == (200, 400, False, 2)
    down = merge(idle, TrimEntry(inode=5, layout=lay, length=4, old_length=10, idle=False, generation=0,
                                 enqueued_ns=2), 3)
    assert (down.length, down.idle) == (4, False)
    # an idle tail merged into a pending shrink: the shrink's cut stays (the lowest)
    shrink = TrimEntry(inode=5, layout=lay, length=30, old_length=90, idle=False, generation=1, enqueued_ns=1)
    tail = merge(shrink, TrimEntry(inode=5, layout=lay, length=60, old_length=70, idle=True, generation=0,
                                   enqueued_ns=2), 3)
    assert (tail.length, tail.idle) == (30, False)
