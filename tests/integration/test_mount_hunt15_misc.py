"""Two mounts of one cluster: what one changes the other sees within the revalidation window
(modes, owners, extended attributes, links, non-empty directories), and the errno Linux gives."""

from __future__ import annotations

import ctypes
import errno
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_mount_hunt15_names import eventually, where  # noqa: F401 - where: a fresh directory through both mounts
from test_mount_locks import two  # noqa: F401 - two: the fixture of two mounts under where
from test_mount_options import mounted

from loomfs.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _check(cond: bool, what: object = None) -> None:
    assert cond, what


def test_rmdir_of_a_directory_the_other_mount_filled(where: tuple[Path, Path]) -> None:  # noqa: F811
    a, b = where
    (a / "d").mkdir()
    assert os.listdir(a / "d") == []
    (b / "d" / "f").write_bytes(b"x")
    with pytest.raises(OSError) as e:
        os.rmdir(a / "d")
    assert e.value.errno == errno.ENOTEMPTY
    assert eventually("the new name listed", lambda: _check(os.listdir(a / "d") == ["f"])) is None


def test_modes_owners_links_and_xattrs_across_mounts(where: tuple[Path, Path]) -> None:  # noqa: F811
    a, b = where
    (a / "x").write_bytes(b"12345")
    st = os.stat(a / "x")
    os.chmod(b / "x", 0o600)
    os.chown(b / "x", 1234, 5678)
    os.link(b / "x", b / "y")
    os.setxattr(b / "x", "user.k", b"v")

    def seen() -> None:
        s = os.stat(a / "x")
        assert (s.st_mode & 0o7777, s.st_uid, s.st_gid, s.st_nlink) == (0o600, 1234, 5678, 2), s
        assert s.st_ctime_ns >= st.st_ctime_ns
    eventually("chmod, chown and link seen", seen)
    assert os.getxattr(a / "y", "user.k") == b"v"
    assert os.stat(a / "y").st_ino == st.st_ino
    os.unlink(a / "x")
    eventually("the unlink seen", lambda: _check(os.stat(b / "y").st_nlink == 1))
    assert (b / "y").read_bytes() == b"12345"


def test_readdir_while_the_other_mount_creates(where: tuple[Path, Path]) -> None:  # noqa: F811
    """Every name that exists throughout a listing is listed exactly once."""
    a, b = where
    (a / "d").mkdir()
    old = {f"old-{i:05d}-{'p' * 40}" for i in range(2500)}
    for n in old:
        (a / "d" / n).write_bytes(b"")
    stop = threading.Event()

    def creator() -> None:
        i = 0
        while not stop.is_set():
            (b / "d" / f"new-{i:05d}").write_bytes(b"")  # some sort before, some after
            (b / "d" / f"a-new-{i:05d}").write_bytes(b"")
            i += 1
    t = threading.Thread(target=creator)
    t.start()
    try:
        for _ in range(3):
            names = os.listdir(a / "d")
            assert len(names) == len(set(names)), "a name listed twice"
            assert old <= set(names), sorted(old - set(names))[:5]
    finally:
        stop.set()
        t.join()


def getdents_names(path: Path, buf_bytes: int) -> list[str]:
    """A directory's names read with getdents64(2) through a buffer of ``buf_bytes`` (Go's
    os.ReadDir reads 8 KiB at a time; glibc 32 KiB): the kernel keeps what did not fit of a
    READDIR reply for no one and asks the mount again from the last entry it handed out."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    buf = ctypes.create_string_buffer(buf_bytes)
    names: list[str] = []
    try:
        while True:
            n = libc.syscall(217, fd, buf, buf_bytes)  # SYS_getdents64 on x86-64
            if n < 0:
                raise OSError(ctypes.get_errno(), "getdents64")
            if n == 0:
                return [x for x in names if x not in (".", "..")]
            pos = 0
            raw = buf.raw
            while pos < n:
                reclen = int.from_bytes(raw[pos + 16:pos + 18], "little")
                name = raw[pos + 19:pos + reclen].split(b"\0", 1)[0]
                names.append(os.fsdecode(name))
                pos += reclen
    finally:
        os.close(fd)


@pytest.fixture(scope="module")
def small_pages(cluster: LocalCluster) -> Iterator[Path]:
    """A mount whose READDIRs ask meta for 16 entries a page: a listing crosses many pages."""
    with mounted(cluster, "-o", "readdir_page=16") as mp:
        yield mp


def test_small_getdents_buffers_while_the_other_mount_creates(where: tuple[Path, Path],  # noqa: F811
                                                              small_pages: Path) -> None:
    a, b = where
    d = small_pages / a.name / "d"
    (a / "d").mkdir()
    old = {f"old-{i:04d}-{'p' * 30}" for i in range(600)}
    for n in old:
        (a / "d" / n).write_bytes(b"")
    stop = threading.Event()

    def creator() -> None:
        i = 0
        while not stop.is_set():
            (b / "d" / f"old-{i % 600:04d}-a-new-{i}").write_bytes(b"")  # sorts among the old ones
            i += 1
    t = threading.Thread(target=creator)
    t.start()
    try:
        for _ in range(3):
            names = getdents_names(d, 1024)
            dup = sorted(n for n in set(names) if names.count(n) > 1)
            assert not dup, f"listed twice: {dup[:5]}"
            assert old <= set(names), sorted(old - set(names))[:5]
    finally:
        stop.set()
        t.join()
