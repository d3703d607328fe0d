"""Two mounts of one cluster, each holding the same file open for writing (a shared log, a
metrics file): what the other mount appended, or cut (logrotate's copytruncate), reaches this
mount's write file within the revalidation window (attr_timeout, 1 s): ``fstat`` shows it and
an ``O_APPEND`` write lands after it, never over it or past a hole. (Appends across mounts
are still not atomic: two at the same moment may both take the same end; these tests
alternate.)"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest
from test_mount_hunt15_names import eventually, where  # noqa: F401 - where: a fresh directory through both mounts
from test_mount_locks import two  # noqa: F401 - two: the fixture of two mounts under where

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
APPEND = os.O_WRONLY | os.O_APPEND


def _size_is(fd: int, size: int) -> None:
    assert os.fstat(fd).st_size == size, (os.fstat(fd).st_size, size)


@pytest.mark.parametrize("start", [0, (2 << 20) + 17], ids=["inline", "chunks"])
def test_appends_alternating_between_two_mounts(where: tuple[Path, Path], start: int) -> None:  # noqa: F811
    a, b = where
    head = os.urandom(start)
    (a / "log").write_bytes(head)
    fa = os.open(a / "log", APPEND)
    fb = os.open(b / "log", APPEND)
    try:
        expect = head
        for k in range(3):
            for fd, other, who in ((fa, fb, b"A"), (fb, fa, b"B")):
                rec = who * 100 + f" {k}\n".encode()
                assert os.write(fd, rec) == len(rec)
                os.fsync(fd)
                expect += rec
                # the other mount's descriptor sees the new end within the window
                eventually(f"{who!r} {k} seen by the other mount", functools.partial(_size_is, other, len(expect)))
    finally:
        os.close(fa)
        os.close(fb)
    got = (b / "log").read_bytes()
    assert len(got) == len(expect) and got == expect


def test_an_append_after_the_other_mount_cut_the_file(where: tuple[Path, Path]) -> None:  # noqa: F811
    """logrotate's copytruncate: the writer's next line starts the file again, no hole."""
    a, b = where
    (a / "app.log").write_bytes(b"")
    fa = os.open(a / "app.log", APPEND)
    try:
        for i in range(5):
            os.write(fa, f"line {i}\n".encode())
        os.fsync(fa)
        assert (b / "app.log").read_bytes().count(b"\n") == 5
        os.truncate(b / "app.log", 0)
        eventually("the cut seen by the writer's mount", lambda: _size_is(fa, 0))
        os.write(fa, b"after\n")
        os.fsync(fa)
    finally:
        os.close(fa)
    assert eventually("the new content", lambda: _equal((b / "app.log").read_bytes(), b"after\n")) is None


def _equal(got: bytes, want: bytes) -> None:
    assert got == want, (len(got), got[:40], want)
