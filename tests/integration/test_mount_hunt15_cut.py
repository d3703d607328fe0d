"""A file one mount holds open read-only (its pages cached, chunks fetched ahead) while the
other mount cuts it: once the new length reached the reader (``fstat``, within attr_timeout),
no byte from before the cut is served past the cut, by the page cache or by the mount's
prefetched chunks. A cut followed by an extend (``truncate`` up) must read zeros there, as
on a local file system, not the bytes the file had before the cut."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_mount_hunt15_names import eventually, where  # noqa: F401 - where: a fresh directory through both mounts
from test_mount_locks import two  # noqa: F401 - two: the fixture of two mounts under where
from test_mount_options import mounted

from loomfs.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
CUT = 1000
CHUNK = 4 << 20  # the default layout's chunk size


@pytest.fixture(scope="module")
def direct(cluster: LocalCluster) -> Iterator[Path]:
    """A third mount whose READs all reach the daemon (``direct_io``): each pread is one READ,
    so a stream of them is served from the chunks the mount fetched ahead."""
    with mounted(cluster, "-o", "direct_io") as mp:
        yield mp


def _size_is(fd: int, size: int) -> None:
    assert os.fstat(fd).st_size == size, (os.fstat(fd).st_size, size)


@pytest.mark.parametrize("size", [40 << 10, (3 << 20) + 5], ids=["inline", "chunks"])
def test_a_cut_and_extend_elsewhere_reads_zeros_through_an_open_reader(where: tuple[Path, Path],  # noqa: F811
                                                                       size: int) -> None:
    a, b = where
    data = os.urandom(size)
    (a / "f").write_bytes(data)
    fd = os.open(a / "f", os.O_RDONLY)
    try:
        for off in range(0, 256 << 10, 64 << 10):  # a stream: cached, and chunks fetched ahead
            assert os.pread(fd, 64 << 10, off) == data[off:off + (64 << 10)]
        os.truncate(b / "f", CUT)
        eventually("the cut seen by the reader", functools.partial(_size_is, fd, CUT))
        assert os.pread(fd, size, 0) == data[:CUT]
        os.truncate(b / "f", size)  # back to the old length: zeros past the cut
        eventually("the extend seen by the reader", functools.partial(_size_is, fd, size))
        # the stream goes on where it was (what was fetched ahead is from before the cut)
        rest = b"".join(os.pread(fd, 64 << 10, off) for off in range(256 << 10, size, 64 << 10))
        assert rest == bytes(len(rest)), "bytes from before the cut served past it"
        got = os.pread(fd, size + 1, 0)
        assert len(got) == size and got[:CUT] == data[:CUT]
        assert got[CUT:] == bytes(size - CUT), "bytes from before the cut served past it"
    finally:
        os.close(fd)


def test_chunks_fetched_ahead_before_a_cut_elsewhere_are_not_served(where: tuple[Path, Path],  # noqa: F811
                                                                     direct: Path) -> None:
    a, b = where
    size = 3 * CHUNK
    data = os.urandom(size)
    (b / "f").write_bytes(data)
    fd = os.open(direct / a.name / "f", os.O_RDONLY)
    try:
        step = 64 << 10
        for off in range(0, 4 * step, step):  # a stream: the next chunks are fetched ahead
            assert os.pread(fd, step, off) == data[off:off + step]
        os.truncate(b / "f", CUT)
        eventually("the cut seen by the reader", functools.partial(_size_is, fd, CUT))
        os.truncate(b / "f", size)
        eventually("the extend seen by the reader", functools.partial(_size_is, fd, size))
        for off in range(4 * step, size, 4 * step):  # whole chunks of the stream, in order
            got = os.pread(fd, step, off)
            assert got == bytes(step), f"bytes from before the cut served at {off}"
    finally:
        os.close(fd)
