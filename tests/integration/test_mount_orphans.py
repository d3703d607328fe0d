"""Unlink while open across mounts: one mount holds files open, another unlinks them (meta's
orphan inodes, loomfs.meta.orphans; the mount's read holds, loomfs.mount.holds). The first goes
on reading, writing and fstat-ing them; nobody sees a name for them; once it closes them meta
drops them."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_mount import _mount, _umount

import loomfs
from loomfs.testing import LocalCluster
from loomfs.wire.meta import SetattrReq
from loomfs.wire.types import Attr

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def two(cluster: LocalCluster) -> Iterator[tuple[str, str]]:
    """(a mount whose reads all reach the daemon: direct_io, a plain mount) of one cluster."""
    a = tempfile.mkdtemp(prefix="loomfs-mnt-a-")
    b = tempfile.mkdtemp(prefix="loomfs-mnt-b-")
    _mount(cluster, a, "-o", "direct_io")
    try:
        _mount(cluster, b)
        try:
            yield a, b
        finally:
            _umount(b)
    finally:
        _umount(a)
        os.rmdir(a)
        os.rmdir(b)


def wait_for(what: str, cond: Callable[[], bool], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_files_open_on_one_mount_survive_an_unlink_on_another(two: tuple[str, str], cluster: LocalCluster) -> None:
    a, b = two
    name = f"orph-{os.getpid()}-{time.monotonic_ns()}"
    da, db = Path(a) / name, Path(b) / name
    db.mkdir()
    big = os.urandom((2 << 20) + 12345)  # in chunks (past the inline limit): a read hold keeps it
    (db / "big").write_bytes(big)
    (db / "small").write_bytes(b"small file")  # inline: the write session keeps it
    replaced = b"replaced" * (20 << 10)  # renamed over on b (in chunks too)
    (db / "over").write_bytes(replaced)
    (db / "tiny").write_bytes(b"tiny")  # inline, read-only: its content came with the open
    (db / "src").write_bytes(b"the new one")
    fs = loomfs.connect(str(cluster.root))
    fds: list[int] = []
    try:
        ro = os.open(da / "big", os.O_RDONLY)
        fds.append(ro)
        rw = os.open(da / "small", os.O_RDWR)
        fds.append(rw)
        ov = os.open(da / "over", os.O_RDONLY)
        fds.append(ov)
        inodes = [os.fstat(fd).st_ino for fd in fds]
        tiny = os.open(da / "tiny", os.O_RDONLY)  # not held: meta drops it at the unlink
        assert os.pread(ro, 100, 0) == big[:100]
        os.unlink(db / "big")
        os.unlink(db / "small")
        os.unlink(db / "tiny")
        os.rename(db / "src", db / "over")
        assert sorted(os.listdir(db)) == ["over"] and (db / "over").read_bytes() == b"the new one"
        assert fs.listdir(f"/{name}") == ["over"]  # no name anywhere, natively either

        def by_inode(ino: int) -> Attr | None:
            try:
                return fs.run(fs.client.meta.setattr(SetattrReq(path=f"/{name}", inode=ino))).attr
            except FileNotFoundError:
                return None

        for ino in inodes:  # meta keeps them, nameless
            kept = by_inode(ino)
            assert kept is not None and kept.nlink == 0, (ino, kept)
        # the holder goes on: every read reaches the mount (direct_io), then storage
        got = b"".join(os.pread(ro, 1 << 20, off) for off in range(0, len(big), 1 << 20))
        assert got == big
        os.pwrite(rw, b"SMALL", 0)
        os.fsync(rw)
        os.fchmod(rw, 0o600)
        assert os.pread(rw, 100, 0) == b"SMALL file"
        assert os.pread(ov, len(replaced) + 1, 0) == replaced
        assert os.pread(tiny, 100, 0) == b"tiny"
        os.close(tiny)
        wait_for("nlink 0 by descriptor", lambda: all(os.fstat(fd).st_nlink == 0 for fd in fds))
        st = os.fstat(rw)
        assert (st.st_mode & 0o777, st.st_size) == (0o600, 10)
        attr = by_inode(inodes[1])
        assert attr is not None and attr.mode & 0o777 == 0o600
        for fd in list(fds):
            fds.remove(fd)
            os.close(fd)
        # closed: meta drops them (a hold's CLOSE at once; an inline writer's at GC's next round)
        wait_for("the orphans to go", lambda: all(by_inode(ino) is None for ino in inodes))
    finally:
        for fd in fds:
            os.close(fd)
        fs.close()



def test_a_reopen_by_proc_fd_keeps_the_hold(two: tuple[str, str], cluster: LocalCluster) -> None:
    """/proc/self/fd/N of a nameless file shares the first descriptor's file, and its read
    hold: closing the first does not let meta drop the file (the reviewer's R2)."""
    a, b = two
    name = f"reopen-{os.getpid()}-{time.monotonic_ns()}"
    (Path(b) / name).mkdir()
    data = os.urandom(300 << 10)
    (Path(b) / name / "f").write_bytes(data)
    fs = loomfs.connect(str(cluster.root))
    fds: list[int] = []
    try:
        fd1 = os.open(Path(a) / name / "f", os.O_RDONLY)
        fds.append(fd1)
        ino = os.fstat(fd1).st_ino
        os.unlink(Path(b) / name / "f")
        fd2 = os.open(f"/proc/self/fd/{fd1}", os.O_RDONLY)
        fds.append(fd2)
        fds.remove(fd1)
        os.close(fd1)
        attr = fs.run(fs.client.meta.setattr(SetattrReq(path=f"/{name}", inode=ino))).attr
        assert attr is not None and attr.nlink == 0  # still held, by fd2 now
        assert os.pread(fd2, len(data) + 1, 0) == data
    finally:
        for fd in fds:
            os.close(fd)
        fs.close()


def test_opens_racing_a_rename_over_get_a_held_file_and_its_own_bytes(two: tuple[str, str],
                                                                      cluster: LocalCluster) -> None:
    """A read-only open on one mount races a rename over its name on the other: whichever
    file it opens, fstat names that file, its bytes are that file's, and meta holds it (the
    reviewer's R3 and R10: before, some opens read the other file's bytes, some an unheld file)."""
    import threading

    a, b = two
    name = f"race-{os.getpid()}-{time.monotonic_ns()}"
    da, db = Path(a) / name, Path(b) / name
    db.mkdir()
    size = 160 << 10  # in chunks: the open takes a read hold
    content: dict[int, bytes] = {}
    fds: list[int] = []
    fs = loomfs.connect(str(cluster.root))
    try:
        for i in range(30):
            old, new = bytes([1 + i]) * size, bytes([200 - i]) * size
            (db / f"f{i}").write_bytes(old)
            (db / f"g{i}").write_bytes(new)
            content[os.stat(db / f"f{i}").st_ino] = old
            content[os.stat(db / f"g{i}").st_ino] = new
            barrier = threading.Barrier(2)
            got: list[int] = []

            def opener(i: int = i, barrier: threading.Barrier = barrier, got: list[int] = got) -> None:
                barrier.wait()
                got.append(os.open(da / f"f{i}", os.O_RDONLY))

            t = threading.Thread(target=opener)
            t.start()
            barrier.wait()
            os.rename(db / f"g{i}", db / f"f{i}")
            t.join()
            fds.extend(got)
            assert got, f"open {i} failed"
        for fd in fds:
            ino = os.fstat(fd).st_ino
            assert os.pread(fd, size + 1, 0) == content[ino]
            assert fs.run(fs.client.meta.setattr(SetattrReq(path=f"/{name}", inode=ino))).attr is not None
    finally:
        for fd in fds:
            os.close(fd)
        fs.close()
