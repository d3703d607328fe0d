"""``storage.hotchunks`` (which whole-chunk reads come from the page cache) and
``net.sendfile.FileRegion`` (a reply payload that is part of a file), without sockets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from loomfs.net.sendfile import FileRegion
from loomfs.storage.hotchunks import HotChunks, Plan, resident


def _file(tmp_path: Path, data: bytes) -> int:
    p = tmp_path / "chunk"
    p.write_bytes(data)
    return os.open(p, os.O_RDONLY)


def _drop(fd: int) -> None:
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


@pytest.mark.skipif(not hasattr(os, "RWF_NOWAIT"), reason="needs preadv2 RWF_NOWAIT")
def test_first_read_direct_then_fill_then_sendfile(tmp_path: Path) -> None:
    data = os.urandom(1 << 20)
    fd = _file(tmp_path, data)
    try:
        _drop(fd)
        if resident(fd, len(data)):
            pytest.skip("this file system keeps the file cached after DONTNEED")
        hot = HotChunks(entries_max=4)
        assert hot.plan("k", fd, len(data)) is Plan.DIRECT  # read once: O_DIRECT, as before
        assert hot.plan("k", fd, len(data)) is Plan.DIRECT  # twice: still (a scan read back once)
        assert hot.plan("k", fd, len(data)) is Plan.FILL  # a third time, not cached: fill the page cache
        buf = bytearray(len(data))
        assert FileRegion(os.dup(fd), 0, len(data)).read_into(memoryview(buf)) == len(data)
        assert bytes(buf) == data and resident(fd, len(data))
        assert hot.plan("k", fd, len(data)) is Plan.SENDFILE  # again, cached
        _drop(fd)
        assert hot.plan("k", fd, len(data)) is Plan.FILL  # evicted by the kernel: checked, not assumed
        assert hot.counts == {Plan.DIRECT: 2, Plan.FILL: 2, Plan.SENDFILE: 1}
        assert repr(hot) == "HotChunks(1/4 direct=2 fill=2 sendfile=1)"
    finally:
        os.close(fd)


def test_lru_is_bounded_and_off_switch() -> None:
    hot = HotChunks(entries_max=2)
    assert [hot.note(k) for k in ("a", "b", "a", "c", "b", "a", "a")] == [0, 0, 1, 0, 0, 0, 1]
    off = HotChunks(entries_max=0)
    assert [off.note("a"), off.note("a")] == [0, 0]


def test_file_region_reads_and_owns_its_fd(tmp_path: Path) -> None:
    data = os.urandom(300_000)
    fd = _file(tmp_path, data)
    r = FileRegion(fd, 1000, 5000)
    assert len(r) == 5000 and bytes(r) == data[1000:6000]
    assert repr(r) == f"FileRegion(fd={fd} offset=1000 length=5000)"
    r.close()
    r.close()  # idempotent
    with pytest.raises(OSError):
        os.fstat(fd)  # the region closed it
    short = FileRegion(_file(tmp_path, data[:100]), 0, 200)  # the file ends inside the region
    with pytest.raises(OSError, match="read 100 of 200"):
        bytes(short)
    short.close()
    with pytest.raises(ValueError):
        FileRegion(-1, -1, 10)
