"""The mount's cache of directory attributes (answers the kernel's GETATTR after each create):
kept no longer than attr_timeout from meta's answer, takes a create's times, and never keeps an
answer that raced a directory change through the mount (no FUSE, no sockets)."""

from __future__ import annotations

import asyncio
import time

import pytest

from loomfs.mount.ops import LoomOperations
from loomfs.mount.options import MountOptions
from loomfs.wire.types import Attr, FileType

DIR = int(FileType.DIRECTORY)


@pytest.fixture
def ops() -> LoomOperations:
    return LoomOperations(None, None, MountOptions.parse(["attr_timeout=5"]))  # type: ignore[arg-type]


def test_a_create_brings_the_attributes_back_with_its_times(ops: LoomOperations) -> None:
    """With meta's time of the create (the new file's ctime), never this host's clock: a
    directory whose times moved when meta was asked again made `tar c` fail ("file changed as
    we read it")."""
    ops._dir_attrs[5] = (Attr(inode=5, type=DIR, nlink=2, mtime_ns=1, ctime_ns=1), time.monotonic())
    known, epoch = ops._dir_create_starts(5)
    assert 5 not in ops._dir_attrs  # stepped aside while the create runs
    ops._dir_created_in(5, known, epoch, 1_234)
    attr, _ = ops._dir_attrs[5]
    assert (attr.mtime_ns, attr.ctime_ns, attr.nlink) == (1_234, 1_234, 2)
    known, epoch = ops._dir_create_starts(5)
    ops._dir_created_in(5, known, epoch, 0)  # an existing file opened: the directory as it was
    assert ops._dir_attrs[5][0].ctime_ns == 1_234
    known, epoch = ops._dir_create_starts(5)
    ops._dir_created_in(5, known, epoch, None)  # failed, or the time unknown: meta is asked next time
    assert 5 not in ops._dir_attrs


def test_another_change_during_a_create_drops_them(ops: LoomOperations) -> None:
    ops._dir_attrs[5] = (Attr(inode=5, type=DIR, nlink=2), time.monotonic())
    known, epoch = ops._dir_create_starts(5)
    with ops._dir_change(5):  # e.g. a mkdir in it meanwhile (nlink moves)
        pass
    ops._dir_created_in(5, known, epoch, 99)
    assert 5 not in ops._dir_attrs


def test_getattr_keeps_no_answer_that_raced_a_change(ops: LoomOperations) -> None:
    calls = []

    async def attr_of(inode: int) -> Attr:
        calls.append(inode)
        if len(calls) == 1:
            ops._dir_changed(inode)  # a change through the mount while meta answers
        return Attr(inode=inode, type=DIR, nlink=2)

    ops._attr_of = attr_of  # type: ignore[method-assign]

    async def go() -> None:
        await ops.getattr(9)
        assert 9 not in ops._dir_attrs  # raced a change: not kept
        await ops.getattr(9)
        assert 9 in ops._dir_attrs  # kept
        await ops.getattr(9)  # answered from it
        assert len(calls) == 2 and ops.stats.requests["getattr_dir_cached"] == 1
        ops._dir_attrs[9] = (ops._dir_attrs[9][0], time.monotonic() - 6)  # older than attr_timeout
        await ops.getattr(9)
        assert len(calls) == 3

    asyncio.run(go())
