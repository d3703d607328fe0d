"""POSIX conformance through a real mount: each scenario runs on a local directory and on the
mount, and what it observed (errnos, link counts, which times moved, bytes) must be the same.

The project's own conformance tests (CI cannot fetch a public suite); see docs/mount.md for a
hand run of pjdfstest. Needs /dev/fuse, fusermount3 and pyfuse3 like tests/integration/test_mount.py.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_mount import _mount, _umount, snapshot

import loomfs
from loomfs.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
AT_FDCWD = -100
RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2


@pytest.fixture(scope="module")
def mnt(cluster: LocalCluster) -> Iterator[str]:
    mp = tempfile.mkdtemp(prefix="loomfs-mnt-posix-")
    _mount(cluster, mp, "-o", "allow_other")  # other users' calls reach the mount (permission tests)
    yield mp
    _umount(mp)
    os.rmdir(mp)


@pytest.fixture()
def roots(mnt: str, request: pytest.FixtureRequest) -> Iterator[tuple[Path, Path]]:
    """(a fresh local directory, a fresh directory in the mount)."""
    remote = Path(mnt) / f"{request.node.name}-{os.getpid()}-{time.monotonic_ns()}"
    remote.mkdir()
    local = Path(tempfile.mkdtemp(prefix="loomfs-posix-"))
    os.chmod(local, 0o755)
    yield local, remote
    shutil.rmtree(local, ignore_errors=True)


def err(fn: Callable[[], object]) -> str:
    """The errno name ``fn`` fails with, or 'ok'."""
    try:
        fn()
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc.errno))
    return "ok"


def same(roots: tuple[Path, Path], scenario: Callable[[Path], Any]) -> Any:
    """Run ``scenario`` on both roots; what it returns (and the trees) must match."""
    local, remote = roots
    want = scenario(local)
    got = scenario(remote)
    assert got == want
    assert snapshot(remote) == snapshot(local)
    return got


def renameat2(src: Path, dst: Path, flags: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(AT_FDCWD, os.fsencode(src), AT_FDCWD, os.fsencode(dst), flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), str(src))


def test_errnos(roots: tuple[Path, Path]) -> None:
    def scenario(r: Path) -> dict[str, str]:
        (r / "d" / "sub").mkdir(parents=True)
        (r / "d" / "sub" / "f").write_bytes(b"x")
        (r / "empty").mkdir()
        (r / "file").write_bytes(b"data")
        os.symlink("nowhere", r / "dangling")
        return {
            "rmdir nonempty": err(lambda: os.rmdir(r / "d")),
            "rmdir file": err(lambda: os.rmdir(r / "file")),
            "rmdir missing": err(lambda: os.rmdir(r / "nope")),
            "unlink dir": err(lambda: os.unlink(r / "empty")),
            "open dir for write": err(lambda: os.open(r / "empty", os.O_WRONLY)),
            "open file as dir": err(lambda: os.open(r / "file", os.O_RDONLY | os.O_DIRECTORY)),
            "file as a path component": err(lambda: os.stat(r / "file" / "x")),
            "create under a file": err(lambda: os.open(r / "file" / "x", os.O_CREAT | os.O_WRONLY)),
            "mkdir existing": err(lambda: os.mkdir(r / "file")),
            "mkdir under missing": err(lambda: os.mkdir(r / "nope" / "x")),
            "O_EXCL existing": err(lambda: os.open(r / "file", os.O_CREAT | os.O_EXCL | os.O_WRONLY)),
            "O_EXCL dangling symlink": err(lambda: os.open(r / "dangling", os.O_CREAT | os.O_EXCL | os.O_WRONLY)),
            "name 256 bytes": err(lambda: os.open(r / ("n" * 256), os.O_CREAT | os.O_WRONLY)),
            "mkdir 256 bytes": err(lambda: os.mkdir(r / ("n" * 256))),
            "stat 256 bytes": err(lambda: os.stat(r / ("n" * 256))),
            "rename dir over file": err(lambda: os.rename(r / "empty", r / "file")),
            "rename file over dir": err(lambda: os.rename(r / "file", r / "empty")),
            "rename over nonempty dir": err(lambda: os.rename(r / "empty", r / "d")),
            "rename into own subtree": err(lambda: os.rename(r / "d", r / "d" / "sub" / "in")),
            "rename missing": err(lambda: os.rename(r / "nope", r / "x")),
            "link to dir": err(lambda: os.link(r / "empty", r / "dlink")),
            "link over existing": err(lambda: os.link(r / "file", r / "empty")),
            "readlink of file": err(lambda: os.readlink(r / "file")),
            "symlink over existing": err(lambda: os.symlink("t", r / "file")),
            "truncate dir": err(lambda: os.truncate(r / "empty", 0)),
            "truncate negative": err(lambda: os.truncate(r / "file", -1)),
            "noreplace existing": err(lambda: renameat2(r / "file", r / "dangling", RENAME_NOREPLACE)),
            "listdir file": err(lambda: os.listdir(r / "file")),
        }

    got = same(roots, scenario)
    assert got["rmdir nonempty"] == "ENOTEMPTY" and got["name 256 bytes"] == "ENAMETOOLONG"


def test_name_of_255_bytes_works(roots: tuple[Path, Path]) -> None:
    def scenario(r: Path) -> list[str]:
        name = "é" * 127 + "x"  # 255 bytes of UTF-8
        (r / name).write_bytes(b"long")
        (r / (name[:-1] + "y")).mkdir()
        return sorted(os.listdir(r))

    same(roots, scenario)


def test_rename_over(roots: tuple[Path, Path]) -> None:
    def scenario(r: Path) -> dict[str, object]:
        (r / "a").write_bytes(b"A" * 100)
        (r / "b").write_bytes(b"B")
        ino_a = os.stat(r / "a").st_ino
        os.rename(r / "a", r / "b")  # over a file: b is a's inode now
        out: dict[str, object] = {"b is a": os.stat(r / "b").st_ino == ino_a,
                                  "a gone": not (r / "a").exists(),
                                  "b bytes": (r / "b").read_bytes()}
        (r / "d1").mkdir()
        (r / "d1" / "x").write_bytes(b"x")
        (r / "d2").mkdir()
        os.rename(r / "d1", r / "d2")  # over an empty directory
        out["d2/x"] = (r / "d2" / "x").read_bytes()
        os.link(r / "b", r / "b2")
        os.rename(r / "b", r / "b2")  # two names of one file: nothing happens (POSIX)
        out["hard link rename"] = (sorted(os.listdir(r)), os.stat(r / "b2").st_nlink)
        os.rename(r / "b2", r / "b2")
        os.symlink("b2", r / "s")
        os.rename(r / "s", r / "s2")  # the link itself moves
        out["symlink"] = os.readlink(r / "s2")
        (r / "sub").mkdir()
        os.rename(r / "b2", r / "sub" / "b3")  # across directories: parents' link counts
        os.rename(r / "d2", r / "sub" / "d3")
        out["nlinks"] = (os.stat(r).st_nlink, os.stat(r / "sub").st_nlink)
        return out

    same(roots, scenario)


def test_rename_exchange(roots: tuple[Path, Path]) -> None:
    def scenario(r: Path) -> object:
        (r / "f").write_bytes(b"file")
        (r / "d").mkdir()
        (r / "d" / "in").write_bytes(b"in")
        (r / "e").mkdir()
        ino_f, ino_d = os.stat(r / "f").st_ino, os.stat(r / "d").st_ino
        renameat2(r / "f", r / "d", RENAME_EXCHANGE)
        swapped = (os.stat(r / "d").st_ino == ino_f, os.stat(r / "f").st_ino == ino_d)
        missing = err(lambda: renameat2(r / "f", r / "nope", RENAME_EXCHANGE))
        renameat2(r / "f", r / "e", RENAME_EXCHANGE)  # two directories
        return swapped, (r / "d").read_bytes(), sorted(os.listdir(r / "e")), missing, os.stat(r).st_nlink

    same(roots, scenario)


def test_hard_link_counts(roots: tuple[Path, Path]) -> None:
    def scenario(r: Path) -> list[object]:
        seen: list[object] = []
        (r / "f").write_bytes(b"f")
        os.link(r / "f", r / "g")
        (r / "sub").mkdir()
        os.link(r / "g", r / "sub" / "h")
        seen.append([os.stat(r / n).st_nlink for n in ("f", "g", "sub/h")])
        seen.append(os.stat(r / "f").st_ino == os.stat(r / "sub" / "h").st_ino)
        with open(r / "sub" / "h", "ab") as f:
            f.write(b"+h")
        seen.append((r / "f").read_bytes())
        os.unlink(r / "f")
        seen.append([os.stat(r / n).st_nlink for n in ("g", "sub/h")])
        (r / "sub" / "d1").mkdir()
        (r / "sub" / "d2").mkdir()
        seen.append((os.stat(r).st_nlink, os.stat(r / "sub").st_nlink))
        os.rmdir(r / "sub" / "d1")
        seen.append(os.stat(r / "sub").st_nlink)
        return seen

    same(roots, scenario)


def test_unlink_while_open(roots: tuple[Path, Path]) -> None:
    def scenario(r: Path) -> list[object]:
        seen: list[object] = []
        fd = os.open(r / "t", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            os.write(fd, b"before")
            os.unlink(r / "t")
            seen.append((r / "t").exists())
            os.write(fd, b"-after")  # written to a file with no name
            seen.append(os.pread(fd, 100, 0))
            seen.append(os.fstat(fd).st_nlink)
            seen.append(os.listdir(r))
            fd2 = os.open(r / "t", os.O_CREAT | os.O_RDWR)  # the name is free for a new file
            os.write(fd2, b"new")
            os.close(fd2)
            seen.append(os.pread(fd, 100, 0))
        finally:
            os.close(fd)
        seen.append((r / "t").read_bytes())
        return seen

    same(roots, scenario)


def test_changes_by_descriptor_after_the_last_unlink(roots: tuple[Path, Path], mnt: str,
                                                     cluster: LocalCluster) -> None:
    """fchmod, ftruncate, futimens, fstat and writes on files whose last name went (unlinked, or
    renamed over), from two descriptors; the name is reused meanwhile; hard links are not
    orphans. Meta keeps such files, nameless, while they are open (loomfs.meta.orphans)."""
    import stat

    def scenario(r: Path) -> list[object]:
        opened: list[int] = []  # closed at the end even when a step fails (no busy mount left)
        try:
            return steps(r, opened)
        finally:
            for fd in opened:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def steps(r: Path, opened: list[int]) -> list[object]:
        def open_(p: Path, flags: int, mode: int = 0o644) -> int:
            opened.append(os.open(p, flags, mode))
            return opened[-1]

        def close_(fd: int) -> None:
            opened.remove(fd)
            os.close(fd)

        seen: list[object] = []
        fd = open_(r / "t", os.O_CREAT | os.O_RDWR)
        ro = open_(r / "t", os.O_RDONLY)
        os.write(fd, b"0123456789")
        os.unlink(r / "t")
        os.fchmod(fd, 0o600)
        os.ftruncate(fd, 4)
        os.utime(fd, ns=(1_000_000_000, 2_000_000_000))
        st = os.fstat(ro)
        seen.append((stat.S_IMODE(st.st_mode), st.st_size, st.st_nlink, st.st_mtime_ns))
        # extended attributes of the nameless file (meta answers them by inode)
        os.setxattr(fd, "user.k1", b"v1")
        os.setxattr(ro, "user.k2", b"v2", os.XATTR_CREATE)
        try:
            os.setxattr(fd, "user.k2", b"again", os.XATTR_CREATE)
        except OSError as exc:
            seen.append(("create twice", exc.errno))
        os.removexattr(fd, "user.k1")
        names = sorted(os.listxattr(ro))
        seen.append((names, os.getxattr(fd, "user.k2")))
        os.pwrite(fd, b"xy", 6)
        seen.append(os.pread(ro, 100, 0))
        again = open_(Path(f"/proc/self/fd/{ro}"), os.O_RDONLY)  # reopened with no name left
        seen.append(os.pread(again, 100, 0))
        close_(again)
        (r / "t").write_bytes(b"a new file")  # the name is free
        seen.append(sorted(os.listdir(r)))
        close_(fd)
        seen.append((os.pread(ro, 100, 0), os.fstat(ro).st_nlink))  # still readable
        close_(ro)
        # renamed over while open
        (r / "old").write_bytes(b"old bytes")
        fd = open_(r / "old", os.O_RDWR)
        (r / "src").write_bytes(b"src")
        os.rename(r / "src", r / "old")
        os.ftruncate(fd, 3)
        os.fchmod(fd, 0o640)
        st = os.fstat(fd)
        seen.append((stat.S_IMODE(st.st_mode), st.st_size, st.st_nlink, os.pread(fd, 10, 0)))
        close_(fd)
        seen.append((r / "old").read_bytes())
        # a hard link left: not an orphan, the other name shows the changes
        (r / "h1").write_bytes(b"linked")
        os.link(r / "h1", r / "h2")
        fd = open_(r / "h1", os.O_RDWR)
        os.unlink(r / "h1")
        os.fchmod(fd, 0o604)
        st = os.fstat(fd)
        seen.append((st.st_nlink, stat.S_IMODE((r / "h2").stat().st_mode)))
        close_(fd)
        return seen

    same(roots, scenario)
    fs = loomfs.connect(str(cluster.root))  # nothing of them under any name, natively either
    try:
        assert not [n for n in fs.listdir("/") if "orphan" in n]
    finally:
        fs.close()


def test_o_append_from_two_descriptors(roots: tuple[Path, Path]) -> None:
    def scenario(r: Path) -> bytes:
        (r / "log").write_bytes(b"start\n")
        a = os.open(r / "log", os.O_WRONLY | os.O_APPEND)
        b = os.open(r / "log", os.O_WRONLY | os.O_APPEND)
        try:
            for i in range(5):
                os.write(a, f"a{i}\n".encode())
                os.write(b, f"b{i}\n".encode())
            os.lseek(a, 0, os.SEEK_SET)  # O_APPEND ignores the position
            os.write(a, b"end\n")
        finally:
            os.close(a)
            os.close(b)
        return (r / "log").read_bytes()

    assert same(roots, scenario).startswith(b"start\na0\nb0\na1\n")


def test_o_trunc_and_o_excl(roots: tuple[Path, Path]) -> None:
    def scenario(r: Path) -> list[object]:
        (r / "f").write_bytes(b"0123456789")
        fd = os.open(r / "f", os.O_RDWR | os.O_TRUNC)
        seen: list[object] = [os.fstat(fd).st_size]
        os.write(fd, b"ab")
        os.close(fd)
        fd = os.open(r / "g", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o640)
        seen.append(oct(os.fstat(fd).st_mode & 0o777))
        os.close(fd)
        seen.append((r / "f").read_bytes())
        return seen

    same(roots, scenario)


def _stamps(p: Path) -> tuple[int, int]:
    st = os.lstat(p)
    return st.st_mtime_ns, st.st_ctime_ns


def _moved(before: tuple[int, int], after: tuple[int, int]) -> str:
    """Which of mtime and ctime moved forward: 'm', 'c', 'mc' or ''."""
    return ("m" if after[0] > before[0] else "") + ("c" if after[1] > before[1] else "")


def test_times(roots: tuple[Path, Path]) -> None:
    """Which calls move mtime and ctime of the file and of its directory."""
    tick_s = 0.02  # times must be able to differ (ns clocks; a little slack for coarse ones)

    def scenario(r: Path) -> dict[str, str]:
        out: dict[str, str] = {}
        (r / "d").mkdir()
        (r / "d" / "f").write_bytes(b"x" * 10)

        def step(name: str, path: Path, fn: Callable[[], object]) -> None:
            before = _stamps(path)
            time.sleep(tick_s)
            fn()
            out[name] = _moved(before, _stamps(path))

        def write() -> None:
            with open(r / "d" / "f", "r+b") as f:
                f.write(b"y")

        step("write: file", r / "d" / "f", write)
        step("chmod: file", r / "d" / "f", lambda: os.chmod(r / "d" / "f", 0o600))
        step("truncate: file", r / "d" / "f", lambda: os.truncate(r / "d" / "f", 3))
        step("link: file", r / "d" / "f", lambda: os.link(r / "d" / "f", r / "d" / "g"))
        step("create: dir", r / "d", lambda: (r / "d" / "n").write_bytes(b""))
        step("unlink: dir", r / "d", lambda: os.unlink(r / "d" / "n"))
        step("unlink other name: file", r / "d" / "f", lambda: os.unlink(r / "d" / "g"))
        step("rename: dir", r / "d", lambda: os.rename(r / "d" / "f", r / "d" / "f2"))
        step("mkdir: dir", r / "d", lambda: os.mkdir(r / "d" / "s"))
        step("read: file", r / "d" / "f2", lambda: (r / "d" / "f2").read_bytes())
        step("stat: dir", r / "d", lambda: os.stat(r / "d" / "f2"))
        os.utime(r / "d" / "f2", ns=(1_500_000_000_000_000_000, 1_600_000_000_000_000_000))
        out["utime"] = str(os.stat(r / "d" / "f2").st_mtime_ns)
        return out

    got = same(roots, scenario)
    assert got["write: file"] == "mc" and got["chmod: file"] == "c"


def test_readdir_while_changing(roots: tuple[Path, Path]) -> None:
    """Entries present from opendir to the end are listed once each, whatever is created
    or removed meanwhile (POSIX leaves the changed ones unspecified)."""
    _, remote = roots
    keep = {f"k{i:04d}" for i in range(0, 1200, 2)}
    gone = {f"k{i:04d}" for i in range(1, 1200, 2)}
    for n in sorted(keep | gone):
        (remote / n).write_bytes(b"")
    listed: list[str] = []
    with os.scandir(remote) as it:
        for k, e in enumerate(it):
            listed.append(e.name)
            if k == 100:
                for n in sorted(gone):
                    os.unlink(remote / n)
                for i in range(300):
                    (remote / f"new{i:03d}").write_bytes(b"")
    assert len(listed) == len(set(listed)), "an entry listed twice"
    assert keep <= set(listed)
    assert set(listed) <= keep | gone | {f"new{i:03d}" for i in range(300)}


def test_permissions_as_another_user(roots: tuple[Path, Path]) -> None:
    """default_permissions: the kernel checks modes for a non-root caller."""
    script = r"""
import errno, os, sys
os.setgid(65534); os.setuid(65534)
r = sys.argv[1]
def err(fn):
    try:
        fn()
    except OSError as exc:
        return errno.errorcode[exc.errno]
    return "ok"
out = {
    "read 0600": err(lambda: os.open(r + "/private", os.O_RDONLY)),
    "read 0644": err(lambda: os.open(r + "/public", os.O_RDONLY)),
    "write 0644": err(lambda: os.open(r + "/public", os.O_WRONLY)),
    "create in 0755": err(lambda: os.open(r + "/closed/x", os.O_CREAT | os.O_WRONLY)),
    "create in 0777": err(lambda: os.close(os.open(r + "/open/x", os.O_CREAT | os.O_WRONLY, 0o600))),
    "list 0700": err(lambda: os.listdir(r + "/secret")),
    "chmod not owner": err(lambda: os.chmod(r + "/public", 0o777)),
    "unlink in sticky": err(lambda: os.unlink(r + "/sticky/f")),
}
st = os.stat(r + "/open/x")
out["owner of new file"] = (st.st_uid, st.st_gid)
print(repr(sorted(out.items())))
"""

    def scenario(r: Path) -> str:
        (r / "private").write_bytes(b"p")
        os.chmod(r / "private", 0o600)
        (r / "public").write_bytes(b"p")
        (r / "closed").mkdir(mode=0o755)
        (r / "open").mkdir()
        os.chmod(r / "open", 0o777)
        (r / "secret").mkdir()
        os.chmod(r / "secret", 0o700)
        (r / "sticky").mkdir()
        os.chmod(r / "sticky", 0o1777)
        (r / "sticky" / "f").write_bytes(b"")
        os.chmod(r / "sticky" / "f", 0o666)
        out = subprocess.run([sys.executable, "-c", script, str(r)], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout

    got = same(roots, scenario)
    assert "('read 0600', 'EACCES')" in got and "('owner of new file', (65534, 65534))" in got


def test_chown_and_setgid_bits(roots: tuple[Path, Path]) -> None:
    def scenario(r: Path) -> list[object]:
        (r / "f").write_bytes(b"")
        os.chmod(r / "f", 0o6755)
        os.chown(r / "f", 1234, 5678)
        st = os.stat(r / "f")
        seen: list[object] = [(st.st_uid, st.st_gid, oct(st.st_mode))]
        os.symlink("f", r / "s")
        os.lchown(r / "s", 42, 43)  # the link, not its target
        seen.append((os.lstat(r / "s").st_uid, os.stat(r / "f").st_uid))
        with contextlib.suppress(OSError):
            os.chmod(r / "f", 0o644)
        seen.append(oct(os.stat(r / "f").st_mode))
        return seen

    same(roots, scenario)


LOCKER = r"""
import fcntl, os, sys
path, kind = sys.argv[1], sys.argv[2]
fd = os.open(path, os.O_RDWR)
try:
    if kind == "flock":
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    else:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 100)  # bytes 100..109
    print("locked")
except OSError as exc:
    print(exc.errno)
"""


def test_locks_between_processes_on_one_mount(roots: tuple[Path, Path]) -> None:
    """flock and fcntl byte-range locks conflict between processes using the mount (the
    kernel keeps them: pyfuse3 has no lock requests, see docs/mount.md)."""
    import fcntl

    def other(path: Path, kind: str) -> str:
        r = subprocess.run([sys.executable, "-c", LOCKER, str(path), kind], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    def scenario(r: Path) -> list[str]:
        p = r / "locked"
        p.write_bytes(b"x" * 200)
        fd = os.open(p, os.O_RDWR)
        seen = []
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            seen.append(other(p, "flock"))
            fcntl.flock(fd, fcntl.LOCK_UN)
            seen.append(other(p, "flock"))
            fcntl.lockf(fd, fcntl.LOCK_EX, 5, 105)  # bytes 105..109 overlap the other's range
            seen.append(other(p, "fcntl"))
            fcntl.lockf(fd, fcntl.LOCK_UN, 5, 105)
            fcntl.lockf(fd, fcntl.LOCK_EX, 10, 0)  # 0..9: no overlap
            seen.append(other(p, "fcntl"))
        finally:
            os.close(fd)
        return seen

    assert same(roots, scenario) == [str(errno.EAGAIN), "locked", str(errno.EAGAIN), "locked"]


def test_layout_xattr(roots: tuple[Path, Path], mnt: str) -> None:
    import json

    _, remote = roots
    (remote / "d").mkdir()
    name = b"user.loomfs.layout"
    assert os.listxattr(remote / "d") == []  # asked for by name only: tools copying attributes skip it
    lay = json.loads(os.getxattr(remote / "d", name))
    assert lay["chains"] == [] and lay["chunk_size"] > 0
    os.setxattr(remote / "d", name, json.dumps({"chunk_size": 1 << 20, "stripe": 2}).encode())
    lay2 = json.loads(os.getxattr(remote / "d", name))
    assert (lay2["chunk_size"], lay2["stripe"], lay2["table_id"]) == (1 << 20, 2, lay["table_id"])
    (remote / "d" / "f").write_bytes(os.urandom(3 << 20))  # inherits: 1 MiB chunks over 2 chains
    flay = json.loads(os.getxattr(remote / "d" / "f", name))
    assert flay["chunk_size"] == 1 << 20 and 1 <= len(flay["chains"]) <= 2
    errs = {
        "set on a file": err(lambda: os.setxattr(remote / "d" / "f", name, b"{}")),
        "bad json": err(lambda: os.setxattr(remote / "d", name, b"{nope")),
        "unknown field": err(lambda: os.setxattr(remote / "d", name, b'{"colour": 1}')),
        "other name get": err(lambda: os.getxattr(remote / "d" / "f", "user.other")),
        "other name set": err(lambda: os.setxattr(remote / "d" / "f", "user.other", b"v")),
        "remove layout": err(lambda: os.removexattr(remote / "d", name)),
        "trusted": err(lambda: os.setxattr(remote / "d", "trusted.x", b"v")),
        "security": err(lambda: os.setxattr(remote / "d", "security.x", b"v")),
    }
    assert errs == {"set on a file": "EPERM", "bad json": "EINVAL", "unknown field": "EINVAL",
                    "other name get": "ENODATA", "other name set": "ok", "remove layout": "EPERM",
                    "trusted": "ENOTSUP", "security": "ENOTSUP"}
    assert os.listxattr(remote / "d" / "f") == ["user.other"]  # the stored ones only
    assert (remote / "d" / "f").stat().st_size == 3 << 20


def test_user_xattrs(roots: tuple[Path, Path]) -> None:
    """user.* attributes: values, flags, errnos, files/directories/links/special files, hard
    links and renames, ctime, and permissions for another user, as on a local directory."""
    import stat

    layout = "user.loomfs.layout"
    script = r"""
import errno, os, sys
os.setgid(65534); os.setuid(65534)
r = sys.argv[1]
def err(fn):
    try:
        fn()
    except OSError as exc:
        return errno.errorcode[exc.errno]
    return "ok"
print(repr(sorted({
    "get 0644": err(lambda: os.getxattr(r + "/public", "user.k")),
    "get 0600": err(lambda: os.getxattr(r + "/private", "user.k")),
    "list 0600": err(lambda: os.listxattr(r + "/private")),
    "set 0644": err(lambda: os.setxattr(r + "/public", "user.k", b"x")),
    "remove 0644": err(lambda: os.removexattr(r + "/public", "user.k")),
    "set 0666": err(lambda: os.setxattr(r + "/open", "user.k", b"x")),
    "set sticky dir": err(lambda: os.setxattr(r + "/sticky", "user.k", b"x")),
    "set 0777 dir": err(lambda: os.setxattr(r + "/shared", "user.k", b"x")),
}.items())))
"""

    def scenario(r: Path) -> list[object]:
        f, d = r / "f", r / "d"
        f.write_bytes(b"data")
        d.mkdir()
        seen: list[object] = []
        before = f.stat().st_ctime_ns
        time.sleep(0.01)  # ctime granularity of the local file system
        os.setxattr(f, "user.a", b"1")
        seen.append(("ctime moved", f.stat().st_ctime_ns > before))
        os.setxattr(f, "user.empty", b"")
        os.setxattr(f, "user.bin", bytes(range(256)))
        os.setxattr(f, b"user.\xc3\xa9", b"e")
        os.setxattr(d, "user.dir", b"D")
        seen.append(sorted(n for n in os.listxattr(f) if n != layout))
        seen.append([os.getxattr(f, n) for n in ("user.a", "user.empty", "user.bin", "user.é")])
        seen.append({
            "create existing": err(lambda: os.setxattr(f, "user.a", b"2", os.XATTR_CREATE)),
            "replace missing": err(lambda: os.setxattr(f, "user.new", b"2", os.XATTR_REPLACE)),
            "replace": err(lambda: os.setxattr(f, "user.a", b"3", os.XATTR_REPLACE)),
            "create": err(lambda: os.setxattr(f, "user.new", b"4", os.XATTR_CREATE)),
            "get missing": err(lambda: os.getxattr(f, "user.none")),
            "remove missing": err(lambda: os.removexattr(f, "user.none")),
            "name 256": err(lambda: os.setxattr(f, "user." + "n" * 251, b"v")),
            "name 255": err(lambda: os.setxattr(f, "user." + "n" * 250, b"v")),
            "value 64 KiB + 1": err(lambda: os.setxattr(f, "user.big", bytes((64 << 10) + 1))),
            "no namespace": err(lambda: os.setxattr(f, "nonamespace", b"v")),
            "user. alone": err(lambda: os.setxattr(f, "user.", b"v")),
            "missing file": err(lambda: os.getxattr(r / "nope", "user.a")),
        })
        os.removexattr(f, "user." + "n" * 250)
        seen.append(os.getxattr(f, "user.a"))
        os.symlink("f", r / "l")
        seen.append({
            "through link": os.getxattr(r / "l", "user.a"),
            "lset on link": err(lambda: os.setxattr(r / "l", "user.a", b"x", follow_symlinks=False)),
            "lget on link": err(lambda: os.getxattr(r / "l", "user.a", follow_symlinks=False)),
            "lremove on link": err(lambda: os.removexattr(r / "l", "user.a", follow_symlinks=False)),
        })
        os.mkfifo(r / "fifo")
        seen.append(err(lambda: os.setxattr(r / "fifo", "user.a", b"x")))
        seen.append((os.listxattr(r / "fifo"), err(lambda: os.getxattr(r / "fifo", layout))))
        os.unlink(r / "fifo")
        os.link(f, r / "h")
        os.rename(f, r / "moved")
        seen.append(os.getxattr(r / "h", "user.a"))
        os.removexattr(r / "moved", "user.a")
        seen.append(err(lambda: os.getxattr(r / "h", "user.a")))
        os.unlink(r / "l")
        # another user: read needs r, change needs w, a sticky directory its owner
        for name, mode in (("public", 0o644), ("private", 0o600), ("open", 0o666)):
            (r / name).write_bytes(b"")
            os.setxattr(r / name, "user.k", b"v")
            os.chmod(r / name, mode)
        (r / "sticky").mkdir()
        os.chmod(r / "sticky", 0o1777)
        (r / "shared").mkdir()
        os.chmod(r / "shared", 0o777)
        out = subprocess.run([sys.executable, "-c", script, str(r)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        seen.append(out.stdout)
        seen.append(stat.S_IMODE((r / "open").stat().st_mode))
        return seen

    got = same(roots, scenario)
    assert "('get 0600', 'EACCES')" in got[-2] and "('set sticky dir', 'EPERM')" in got[-2]


def test_special_files(roots: tuple[Path, Path]) -> None:
    """mkfifo, mknod of devices, a bound unix socket: types, modes, device numbers, links and
    renames; a FIFO in the mount carries bytes between two processes (the kernel serves it)."""
    import socket
    import stat

    def scenario(r: Path) -> list[object]:
        os.mkfifo(r / "fifo", 0o640)
        os.mknod(r / "chr", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        os.mknod(r / "blk", 0o600 | stat.S_IFBLK, os.makedev(7, 9))
        os.mknod(r / "reg", 0o644 | stat.S_IFREG)
        s = socket.socket(socket.AF_UNIX)
        try:
            s.bind(str(r / "sock"))
        finally:
            s.close()
        seen: list[object] = []
        for n in ("fifo", "chr", "blk", "reg", "sock"):
            st = os.lstat(r / n)
            seen.append((n, stat.S_IFMT(st.st_mode), oct(stat.S_IMODE(st.st_mode) & ~0o022), st.st_size,
                         (os.major(st.st_rdev), os.minor(st.st_rdev)) if n in ("chr", "blk") else None))
        os.link(r / "fifo", r / "fifo2")
        os.rename(r / "chr", r / "chr2")
        os.unlink(r / "blk")
        seen.append((os.lstat(r / "fifo").st_nlink, sorted(os.listdir(r))))
        writer = subprocess.Popen([sys.executable, "-c", f"open({str(r / 'fifo')!r}, 'wb').write(b'through')"])
        with open(r / "fifo2", "rb") as f:
            seen.append(f.read())
        assert writer.wait(timeout=30) == 0
        seen.append(err(lambda: os.readlink(r / "fifo")))
        for n in ("fifo", "fifo2", "chr2", "sock"):  # the tree snapshot would open them
            os.unlink(r / n)
        return seen

    same(roots, scenario)


def test_fchmod_after_another_client_renamed(roots: tuple[Path, Path], cluster: LocalCluster) -> None:
    """Attribute changes go to the open file's inode, not to whatever took its old name."""
    import loomfs

    _, remote = roots
    (remote / "x").write_bytes(b"old")
    fd = os.open(remote / "x", os.O_RDWR)
    try:
        rel = f"/{remote.name}"
        with loomfs.connect(str(cluster.root)) as fs:
            fs.rename(f"{rel}/x", f"{rel}/y")
            fs.pipe(f"{rel}/x", b"new")
            os.fchmod(fd, 0o600)
            os.ftruncate(fd, 1)
            assert (fs.stat(f"{rel}/y").st_mode & 0o777, fs.stat(f"{rel}/y").st_size) == (0o600, 1)
            assert (fs.stat(f"{rel}/x").st_mode & 0o777, fs.cat(f"{rel}/x")) == (0o644, b"new")
    finally:
        os.close(fd)


def test_setgid_directory_and_new_objects_owners(roots: tuple[Path, Path]) -> None:
    """What another user creates belongs to them; in a set-group-ID directory new files
    take its group and new subdirectories its set-group-ID bit (Linux)."""
    script = r"""
import os, socket, sys
os.setgid(65534); os.setuid(65534)
r = sys.argv[1]
for d in ("plain", "sgid"):
    open(f"{r}/{d}/f", "w").close()
    os.mkdir(f"{r}/{d}/sub")
    os.symlink("f", f"{r}/{d}/l")
    os.mkfifo(f"{r}/{d}/p")
out = []
for d in ("plain", "sgid"):
    for n in ("f", "sub", "l", "p"):
        st = os.lstat(f"{r}/{d}/{n}")
        out.append((d, n, st.st_uid, st.st_gid, bool(st.st_mode & 0o2000) if n == "sub" else None))
print(repr(out))
"""

    def scenario(r: Path) -> str:
        for d in ("plain", "sgid"):
            (r / d).mkdir()
            os.chown(r / d, 0, 4321)
            os.chmod(r / d, 0o2777 if d == "sgid" else 0o777)
        out = subprocess.run([sys.executable, "-c", script, str(r)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        for d in ("plain", "sgid"):
            os.unlink(r / d / "p")  # the tree snapshot would open it
        return out.stdout

    got = same(roots, scenario)
    assert "('sgid', 'f', 65534, 4321, None)" in got and "('plain', 'sub', 65534, 65534, False)" in got


def test_two_descriptors_of_one_file(roots: tuple[Path, Path]) -> None:
    """What one descriptor writes, another of the same file reads and sizes at once, even
    when the kernel's pages are dropped (the reads reach the mount)."""
    def scenario(r: Path) -> list[object]:
        p = r / "f"
        p.write_bytes(b"0" * 5000)
        a, b = os.open(p, os.O_RDWR), os.open(p, os.O_RDWR)
        c = os.open(p, os.O_RDONLY)
        seen: list[object] = []
        try:
            os.pwrite(a, b"A" * 3000, 4000)  # past b's idea of the end
            for fd in (a, b, c):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            seen += [os.fstat(b).st_size, os.pread(b, 3000, 4500), os.pread(c, 10, 6990)]
            os.pwrite(b, b"B" * 10, 100)
            os.ftruncate(a, 6000)
            for fd in (a, b, c):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            seen += [os.fstat(c).st_size, os.pread(a, 200, 0), os.pread(c, 100, 5950)]
        finally:
            for fd in (a, b, c):
                os.close(fd)
        return seen

    same(roots, scenario)


def test_mmap_read_and_shared_write(roots: tuple[Path, Path]) -> None:
    import mmap

    def scenario(r: Path) -> list[object]:
        p = r / "m"
        p.write_bytes(bytes(range(256)) * 64)  # 16 KiB
        with open(p, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
            seen: list[object] = [m[100:110], m[-5:]]
            m[0:4] = b"MMAP"  # a shared writable mapping: written back at msync
            m.flush()
        seen.append(p.read_bytes()[:8])
        with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
            seen.append(m[:16])
        return seen

    same(roots, scenario)


def test_descriptor_used_after_a_close(roots: tuple[Path, Path], cluster: LocalCluster) -> None:
    """The close(2) of a file's only descriptor closes its client file (one round trip for a
    small file); a dup'd descriptor and a shared mapping made before the close go on writing
    (the open file is reopened), and what they wrote is what another client reads."""
    import mmap

    def scenario(r: Path) -> list[object]:
        p = r / "d"
        fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
        fd2 = os.dup(fd)
        os.write(fd, b"first.")
        os.close(fd)  # FLUSH: the file is closed, fd2 still open
        seen: list[object] = [p.read_bytes()]
        os.write(fd2, b"second.")
        seen.append(os.pread(fd2, 64, 0))
        m = mmap.mmap(fd2, 13)
        os.close(fd2)
        seen.append(p.read_bytes())
        m[0:5] = b"FIRST"  # through the mapping, after its descriptors are gone
        m.flush()
        m.close()
        seen.append(p.read_bytes())
        return seen

    same(roots, scenario)
    with loomfs.connect(str(cluster.root)) as fs:
        assert fs.cat(f"/{roots[1].name}/d") == b"FIRST.second."
