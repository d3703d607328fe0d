"""A real FUSE mount of the shared cluster: tools and Python's os/shutil/sqlite3 run on it and
on a local directory, and the two trees must match. Needs /dev/fuse, fusermount3 and pyfuse3
(scripts/test.sh installs them); nothing here skips."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import loomfs
from loomfs.mount import daemon
from loomfs.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
LOOMFS = [sys.executable, "-m", "loomfs.cli.main"]


def _mount(cluster: LocalCluster, mp: str, *opts: str) -> None:
    r = subprocess.run([*LOOMFS, "--dir", str(cluster.root), "mount", mp, *opts],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert daemon.is_mounted(mp)


def _umount(mp: str) -> None:
    r = subprocess.run([*LOOMFS, "umount", mp], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert not daemon.is_mounted(mp)


@pytest.fixture(scope="module")
def mnt(cluster: LocalCluster) -> Iterator[str]:
    mp = tempfile.mkdtemp(prefix="loomfs-mnt-")
    _mount(cluster, mp)
    yield mp
    _umount(mp)
    os.rmdir(mp)


@pytest.fixture()
def pair(mnt: str, request: pytest.FixtureRequest) -> Iterator[tuple[Path, Path]]:
    """(a fresh directory in the mount, a fresh local directory)."""
    name = f"{request.node.name}-{os.getpid()}-{time.monotonic_ns()}"
    remote = Path(mnt) / name
    remote.mkdir()
    local = Path(tempfile.mkdtemp(prefix="loomfs-local-"))
    yield remote, local
    shutil.rmtree(local, ignore_errors=True)


def snapshot(root: Path) -> dict[str, tuple[object, ...]]:
    """Everything POSIX tools care about in a tree, minus times and inode numbers."""
    out: dict[str, tuple[object, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = ("l", os.readlink(p))
            elif p.is_dir():
                out[rel] = ("d", oct(st.st_mode & 0o7777), user_xattrs(p))
            else:
                digest = hashlib.sha256(p.read_bytes()).hexdigest()
                out[rel] = ("f", oct(st.st_mode & 0o7777), st.st_size, st.st_nlink, digest, user_xattrs(p))
    return out


def user_xattrs(p: Path) -> tuple[tuple[str, bytes], ...]:
    """The user.* attributes listed (the mount's virtual layout one never is), sorted."""
    names = sorted(n for n in os.listxattr(p) if n.startswith("user."))
    return tuple((n, os.getxattr(p, n)) for n in names)


def both(pair: tuple[Path, Path], fn: object) -> None:
    remote, local = pair
    for root in (local, remote):
        fn(root)  # type: ignore[operator]
    assert snapshot(remote) == snapshot(local)


def make_tree(root: Path) -> None:
    (root / "src" / "pkg").mkdir(parents=True)
    for i in range(20):
        (root / "src" / "pkg" / f"m{i}.py").write_text(f"x = {i}\n" * (i * 50))
    (root / "src" / "big.bin").write_bytes(bytes(range(256)) * 12_000)  # ~3 MiB, chunked
    (root / "src" / "empty").write_bytes(b"")
    os.chmod(root / "src" / "pkg" / "m3.py", 0o600)
    os.symlink("pkg/m1.py", root / "src" / "link")
    os.link(root / "src" / "pkg" / "m2.py", root / "src" / "hard")
    os.setxattr(root / "src" / "pkg" / "m4.py", "user.origin", b"dataset-v1")  # tools carry them (or not)
    os.setxattr(root / "src" / "big.bin", "user.crc", bytes(range(32)))
    os.setxattr(root / "src" / "pkg", "user.dir", b"d")


def test_python_os_and_shutil(pair: tuple[Path, Path], cluster: LocalCluster) -> None:
    def ops(root: Path) -> None:
        make_tree(root)
        shutil.copytree(root / "src", root / "copy", symlinks=True)
        os.rename(root / "copy" / "pkg", root / "copy" / "pkg2")
        (root / "copy" / "pkg2" / "m5.py").unlink()
        os.rmdir(root / "src" / "pkg" / "__pycache__") if (root / "src" / "pkg" / "__pycache__").exists() else None
        os.mkdir(root / "gone")
        os.rmdir(root / "gone")
        with open(root / "copy" / "log", "a") as f:
            f.write("one\n")
        with open(root / "copy" / "log", "a") as f:
            f.write("two\n")
        with open(root / "copy" / "rw", "w+b") as f:
            f.write(b"0123456789" * 1000)
            f.seek(5)
            f.write(b"XX")
            f.truncate(7000)
            f.seek(0)
            assert f.read(8) == b"01234XX7"
        os.truncate(root / "copy" / "big.bin", 1_000_001)
        os.chmod(root / "copy" / "log", 0o640)
        os.utime(root / "copy" / "log", ns=(1_000_000_000, 2_000_000_000))
        assert os.stat(root / "copy" / "log").st_mtime_ns == 2_000_000_000
        with pytest.raises(FileExistsError):
            os.open(root / "copy" / "log", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        fd = os.open(root / "copy" / "log", os.O_WRONLY | os.O_TRUNC)
        os.write(fd, b"new")
        os.close(fd)
        shutil.rmtree(root / "src" / "pkg")

    both(pair, ops)
    remote, _ = pair
    st = os.stat(remote / "copy" / "big.bin")
    assert st.st_blocks == (st.st_size + 511) // 512
    assert os.stat(remote / "copy").st_ino != os.stat(remote / "src").st_ino
    assert os.statvfs(remote).f_bavail > 0
    # df agrees with loomfs top / the dashboard (issue 15 item 11): each disk once
    from loomfs.metrics.capacity import cluster_capacity

    vfs, cap = os.statvfs(remote), cluster_capacity(cluster.routing())
    assert vfs.f_blocks * vfs.f_frsize == cap.capacity_bytes // 4096 * 4096
    assert abs(vfs.f_bavail * vfs.f_frsize - cap.free_bytes) < 64 << 20  # usage moves between the two reads


def test_directory_times_after_creates_are_metas(pair: tuple[Path, Path], cluster: LocalCluster) -> None:
    """After creates through the mount, the directory's mtime and ctime the mount answers (from
    its cache, without asking meta) are the ones meta stamped: they do not move when meta is
    asked again, which made `tar c` of a fresh tree fail ("file changed as we read it")."""
    remote, _ = pair
    rel = "/" + str(remote.relative_to(remote.parent))
    with loomfs.connect(str(cluster.root)) as fs:
        for i in range(5):
            with open(remote / f"f{i}", "wb") as f:  # FUSE CREATE, then the kernel's GETATTR of the directory
                f.write(b"x" * (i + 1) * 100_000)
            st, meta = os.stat(remote), fs.stat(rel)
            assert (st.st_mtime_ns, st.st_ctime_ns) == (meta.st_mtime_ns, meta.st_ctime_ns), i
        r = subprocess.run(["tar", "-C", str(remote), "-cf", "-", "."], capture_output=True, timeout=60)
        assert r.returncode == 0, r.stderr


def test_dot_entries(pair: tuple[Path, Path], mnt: str) -> None:
    """A listing has "." and ".." first, as on a local directory (``ls -a``), with the
    directory's and its parent's inode numbers; seeking back into a listing keeps them."""
    def ops(root: Path) -> None:
        (root / "d" / "e").mkdir(parents=True)
        for i in range(5):
            (root / "d" / f"f{i}").write_bytes(b"x")

    both(pair, ops)
    remote, local = pair

    def ls(*args: str) -> list[str]:
        return subprocess.run(["ls", *args], capture_output=True, text=True, check=True).stdout.split()

    assert ls("-a1", str(remote / "d")) == ls("-a1", str(local / "d")) == [".", "..", "e", "f0", "f1", "f2", "f3", "f4"]
    for d in (remote / "d" / "e", remote / "d", Path(mnt)):  # (ls stats the mount root's "..")
        got = dict(reversed(line.split()) for line in subprocess.run(
            ["ls", "-ai1", str(d)], capture_output=True, text=True, check=True).stdout.splitlines())
        assert int(got["."]) == os.stat(d).st_ino and int(got[".."]) == os.stat(d / "..").st_ino
    fd = os.open(remote / "d", os.O_RDONLY | os.O_DIRECTORY)
    try:  # getdents from the start twice (a rewind), through the same descriptor
        assert sorted(os.listdir(fd)) == ["e", "f0", "f1", "f2", "f3", "f4"]
        os.lseek(fd, 0, os.SEEK_SET)
        assert sorted(os.listdir(fd)) == ["e", "f0", "f1", "f2", "f3", "f4"]
    finally:
        os.close(fd)


def test_fallocate(pair: tuple[Path, Path]) -> None:
    """fallocate(1) and posix_fallocate through the mount as on a local directory: mode 0 grows
    the file (zeros), inside it changes nothing, --keep-size changes nothing; a read-only
    descriptor is EBADF. Punching holes is not offered (EOPNOTSUPP)."""

    def ops(root: Path) -> None:
        subprocess.run(["fallocate", "-l", "1M", str(root / "a")], check=True)
        (root / "b").write_bytes(b"abc")
        subprocess.run(["fallocate", "-o", "10", "-l", "100", str(root / "b")], check=True)
        subprocess.run(["fallocate", "-o", "0", "-l", "50", str(root / "b")], check=True)  # inside: unchanged
        subprocess.run(["fallocate", "-n", "-l", "10M", str(root / "b")], check=True)  # keep size
        fd = os.open(root / "c", os.O_CREAT | os.O_RDWR)
        os.write(fd, b"hello")
        os.posix_fallocate(fd, 4096, 3 << 20)
        os.pwrite(fd, b"end", (3 << 20) + 4093)
        os.close(fd)
        fd = os.open(root / "c", os.O_RDONLY)
        try:
            with pytest.raises(OSError) as ei:
                os.posix_fallocate(fd, 0, 10 << 20)
            assert ei.value.errno == errno.EBADF
        finally:
            os.close(fd)

    both(pair, ops)
    remote, _ = pair
    assert (remote / "b").read_bytes() == b"abc" + bytes(107)
    r = subprocess.run(["fallocate", "-p", "-o", "0", "-l", "2", str(remote / "b")], capture_output=True, text=True)
    assert r.returncode != 0 and (remote / "b").read_bytes()[:3] == b"abc"


def test_fallocate_never_cuts_another_clients_bytes(pair: tuple[Path, Path], cluster: LocalCluster) -> None:
    """The reviewer's case: the mount has the file open (its idea of the length: 1 byte) while
    another client makes it 1 MiB; a fallocate of 4 KiB through the mount must not cut it."""
    remote, _ = pair
    rel = "/" + str(remote.relative_to(remote.parent)) + "/f"
    fd = os.open(remote / "f", os.O_CREAT | os.O_RDWR)
    try:
        os.write(fd, b"a")
        os.fsync(fd)
        big = os.urandom(1 << 20)
        with loomfs.connect(str(cluster.root)) as fs:
            with fs.open(rel, "r+b") as f:
                f.write(big)
            os.posix_fallocate(fd, 0, 4096)
            assert fs.stat(rel).st_size == 1 << 20
    finally:
        os.close(fd)
    with loomfs.connect(str(cluster.root)) as fs:
        assert fs.stat(rel).st_size == 1 << 20 and fs.cat(rel) == big


def test_huge_directory_streams(pair: tuple[Path, Path], cluster: LocalCluster) -> None:
    """A few thousand entries (several READDIR pages) listed through the mount, twice at once."""
    remote, _ = pair
    names = {f"e{i:05d}-{'x' * (i % 40)}": bytes([i % 251]) * (i % 7) for i in range(3000)}
    with loomfs.connect(str(cluster.root)) as fs:
        fs.mkdir(f"/{remote.name}/huge")
        assert not any(fs.put_many({f"/{remote.name}/huge/{n}": b for n, b in names.items()}))
    seen: dict[str, int] = {}
    with os.scandir(remote / "huge") as one, os.scandir(remote / "huge") as two:
        for a, b in zip(one, two, strict=False):  # two opendirs interleaved: each has its own cursor
            seen[a.name] = a.stat(follow_symlinks=False).st_size
            assert b.name in names
        assert not list(one) and not list(two)
    assert seen == {n: len(b) for n, b in names.items()}
    assert sorted(os.listdir(remote / "huge")) == sorted(names)


def test_many_threads_read_one_file(pair: tuple[Path, Path]) -> None:
    remote, _ = pair
    data = os.urandom(6 << 20)
    (remote / "shared.bin").write_bytes(data)
    errors: list[BaseException] = []

    def reader(k: int) -> None:
        try:
            if k % 2:  # a whole-file read, each with its own open
                assert hashlib.sha256((remote / "shared.bin").read_bytes()).digest() == hashlib.sha256(data).digest()
            else:  # scattered preads through one descriptor per thread
                rng = random.Random(k)
                fd = os.open(remote / "shared.bin", os.O_RDONLY)
                try:
                    for _ in range(64):
                        off, n = rng.randrange(len(data)), rng.choice((1, 4096, 65536, 1 << 20))
                        assert os.pread(fd, n, off) == data[off:off + n]
                finally:
                    os.close(fd)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)


WRITER = """
import os, sys
path, k, n, block = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
fd = os.open(path, os.O_WRONLY)
for i in range(k, 64, n):  # interleaved blocks: every writer extends the file now and then
    os.pwrite(fd, bytes([i]) * block, i * block)
os.fsync(fd)
os.close(fd)
"""


@pytest.mark.parametrize("how", ["threads", "processes"])
def test_disjoint_writes_to_one_file(pair: tuple[Path, Path], how: str) -> None:
    """Four writers, one file, disjoint interleaved 64 KiB blocks: every byte lands."""
    remote, _ = pair
    path = remote / "w.bin"
    path.write_bytes(b"")
    block, writers = 64 << 10, 4
    if how == "processes":
        procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(k), str(writers), str(block)])
                 for k in range(writers)]
        assert [p.wait(timeout=60) for p in procs] == [0] * writers
    else:
        errors: list[BaseException] = []

        def writer(k: int) -> None:
            try:
                fd = os.open(path, os.O_WRONLY)
                try:
                    for i in range(k, 64, writers):
                        assert os.pwrite(fd, bytes([i]) * block, i * block) == block
                finally:
                    os.close(fd)
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                errors.append(exc)

        threads = [threading.Thread(target=writer, args=(k,)) for k in range(writers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not errors, errors
    want = b"".join(bytes([i]) * block for i in range(64))
    assert path.stat().st_size == len(want)
    got = path.read_bytes()
    assert got == want, [i for i in range(64) if got[i * block:(i + 1) * block] != want[i * block:(i + 1) * block]]


def test_open_file_outlives_its_name(pair: tuple[Path, Path]) -> None:
    """fstat, read and write through descriptors whose file's last name was unlinked (or
    renamed over), the same as on a local directory."""
    remote, _ = pair

    def ops(root: Path) -> None:
        with contextlib.ExitStack() as fds:
            def opened(path: Path, flags: int) -> int:
                fd = os.open(path, flags)
                fds.callback(os.close, fd)
                return fd

            p = root / "gone.bin"
            p.write_bytes(b"a" * 5000)
            os.chmod(p, 0o640)
            fd, rfd = opened(p, os.O_RDWR), opened(p, os.O_RDONLY)
            ino = os.fstat(fd).st_ino
            os.unlink(p)
            st = os.fstat(fd)
            assert (st.st_ino, st.st_size, st.st_nlink, oct(st.st_mode & 0o7777)) == (ino, 5000, 0, "0o640")
            assert os.fstat(rfd).st_size == 5000 and os.pread(rfd, 100, 4950) == b"a" * 50
            p.write_bytes(b"new")  # the name again, a different file
            os.pwrite(fd, b"b" * 3000, 4000)
            os.fsync(fd)
            st = os.fstat(fd)
            assert (st.st_ino, st.st_size, st.st_nlink) == (ino, 7000, 0)
            assert os.pread(fd, 8000, 0) == b"a" * 4000 + b"b" * 3000
            os.ftruncate(fd, 6000)  # the unnamed file (the mount keeps it: loomfs.mount.orphans)
            assert os.fstat(fd).st_size == 6000 and os.fstat(rfd).st_size == 6000
            assert os.stat(p).st_size == 3 and os.stat(p).st_ino != ino  # the new name untouched
            assert p.read_bytes() == b"new"
            # renamed over: the replaced file's descriptor keeps its attributes
            (root / "old").write_bytes(b"o" * 10)
            (root / "other").write_bytes(b"x")
            fd = opened(root / "old", os.O_RDONLY)
            os.rename(root / "other", root / "old")
            st = os.fstat(fd)
            assert (st.st_size, st.st_nlink) == (10, 0) and os.read(fd, 100) == b"o" * 10
            # renamed, then truncated through a descriptor: the file under its new name
            (root / "r1").write_bytes(b"r" * 100)
            fd = opened(root / "r1", os.O_RDWR)
            os.rename(root / "r1", root / "r2")
            (root / "r1").write_bytes(b"other")
            os.ftruncate(fd, 40)
            assert (root / "r2").stat().st_size == 40 and (root / "r1").read_bytes() == b"other"

    both(pair, ops)


def test_rename_noreplace(pair: tuple[Path, Path]) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    remote, _ = pair
    (remote / "a").write_text("a")
    (remote / "b").write_text("b")
    at_fdcwd, noreplace = -100, 1
    rc = libc.renameat2(at_fdcwd, str(remote / "a").encode(), at_fdcwd, str(remote / "b").encode(), noreplace)
    assert rc == -1 and ctypes.get_errno() == errno.EEXIST
    rc = libc.renameat2(at_fdcwd, str(remote / "a").encode(), at_fdcwd, str(remote / "c").encode(), noreplace)
    assert rc == 0 and (remote / "c").read_text() == "a" and not (remote / "a").exists()


def test_shell_tools(pair: tuple[Path, Path]) -> None:
    src = Path(tempfile.mkdtemp(prefix="loomfs-src-"))
    make_tree(src)
    archive = src.parent / f"{src.name}.tar"
    subprocess.run(["tar", "--xattrs", "-cf", str(archive), "-C", str(src), "."], check=True)
    noise = src.parent / f"{src.name}.noise"
    noise.write_bytes(os.urandom(8192))

    def ops(root: Path) -> None:
        subprocess.run(["cp", "-a", str(src), str(root / "cpa")], check=True)
        (root / "x").mkdir()
        subprocess.run(["tar", "--xattrs", "-xf", str(archive), "-C", str(root / "x")], check=True)
        (root / "nox").mkdir()  # without --xattrs: none restored
        subprocess.run(["tar", "xf", str(archive), "-C", str(root / "nox"), "./src/big.bin"], check=True)
        subprocess.run(["tar", "cf", str(root / "again.tar"), "-C", str(root / "x"), "./src/pkg"], check=True)
        (root / "again.txt").write_text("".join(sorted(subprocess.run(
            ["tar", "tvf", str(root / "again.tar")], capture_output=True, text=True, check=True,
        ).stdout.splitlines(keepends=True))))
        (root / "again.tar").unlink()  # entry order follows readdir order, which differs
        subprocess.run(["dd", "if=/dev/zero", f"of={root / 'dd.bin'}", "bs=1M", "count=3", "status=none"], check=True)
        subprocess.run(["dd", f"if={noise}", f"of={root / 'dd.bin'}", "bs=4k", "seek=5", "count=2",
                        "conv=notrunc", "status=none"], check=True)
        (root / "find.txt").write_text("\n".join(sorted(subprocess.run(
            ["find", ".", "-path", "./find.txt", "-prune", "-o", "-type", "f", "-size", "+1k", "-print"],
            cwd=root, capture_output=True, text=True, check=True).stdout.split())))

    remote, local = pair
    try:
        both(pair, ops)
    finally:
        shutil.rmtree(src, ignore_errors=True)
        archive.unlink()
        noise.unlink()
    assert "./cpa/src/pkg/m7.py" in (remote / "find.txt").read_text().split()
    for tree in ("cpa", "x"):  # cp -a and tar --xattrs carried the user attributes into the mount
        assert os.getxattr(remote / tree / "src" / "pkg" / "m4.py", "user.origin") == b"dataset-v1"
        assert os.getxattr(remote / tree / "src" / "pkg", "user.dir") == b"d"
    assert "user.crc" not in os.listxattr(remote / "nox" / "src" / "big.bin")
    r = subprocess.run(["cmp", str(remote / "cpa" / "src" / "big.bin"), str(local / "cpa" / "src" / "big.bin")])
    assert r.returncode == 0
    # cp -a keeps times
    assert os.stat(remote / "cpa" / "src" / "big.bin").st_mtime_ns == os.stat(local / "cpa" / "src" / "big.bin").st_mtime_ns


GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
           "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z", "GIT_CONFIG_NOSYSTEM": "1", "HOME": "/nonexistent"}


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True,
                          env={**os.environ, **GIT_ENV}, timeout=60).stdout


def test_git_clone(pair: tuple[Path, Path]) -> None:
    """git clone of a small local repo, then a commit in the clone: the same in the mount as locally."""
    src = Path(tempfile.mkdtemp(prefix="loomfs-git-"))
    try:
        _git("init", "-q", "-b", "main", ".", cwd=src)
        make_tree(src)
        (src / "run.sh").write_text("#!/bin/sh\necho hi\n")
        os.chmod(src / "run.sh", 0o755)
        _git("add", "-A", cwd=src)
        _git("commit", "-q", "-m", "one", cwd=src)
        for i in range(3):
            (src / "src" / "pkg" / f"m{i}.py").write_text(f"y = {i}\n" * 300)
            _git("commit", "-q", "-am", f"change {i}", cwd=src)

        def ops(root: Path) -> None:
            _git("clone", "-q", "--no-local", str(src), str(root / "clone"), cwd=root)
            clone = root / "clone"
            (clone / "new.txt").write_text("added in the clone\n")
            os.remove(clone / "src" / "empty")
            _git("add", "-A", cwd=clone)
            _git("commit", "-q", "-m", "in the clone", cwd=clone)
            _git("fsck", "--full", "--strict", cwd=clone)
            assert _git("status", "--porcelain", cwd=clone) == ""

        remote, local = pair
        for root in (local, remote):
            ops(root)

        def tree(root: Path) -> dict[str, tuple[object, ...]]:
            return {k: v for k, v in snapshot(root / "clone").items() if not k.startswith(".git")}

        def git_names(root: Path) -> dict[str, str]:  # .git's files and modes (contents hold times)
            top = root / "clone" / ".git"
            return {str(p.relative_to(top)): oct(p.lstat().st_mode) for p in top.rglob("*")}

        assert tree(remote) == tree(local)
        assert git_names(remote) == git_names(local)
        log = ["log", "--format=%H %s", "--name-status"]
        assert _git(*log, cwd=remote / "clone") == _git(*log, cwd=local / "clone")
        assert "in the clone" in _git(*log, cwd=remote / "clone")
    finally:
        shutil.rmtree(src, ignore_errors=True)


def _rsync(*args: str) -> str:
    r = subprocess.run(["rsync", *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"rsync {' '.join(args)}: exit {r.returncode}: {r.stderr}"
    return r.stdout


def test_rsync(pair: tuple[Path, Path]) -> None:
    """rsync -aHX into the mount and locally, then an incremental run after changes at the
    source (a changed file goes to a temporary name renamed over the old one, --delete removes
    one, --inplace rewrites one in place), then the mount as rsync's source: the trees match,
    and a checksum dry run finds nothing left to send (times, modes, links, xattrs carried)."""
    src = Path(tempfile.mkdtemp(prefix="loomfs-rsync-"))
    back = Path(tempfile.mkdtemp(prefix="loomfs-rsync-back-"))
    try:
        make_tree(src)

        def ops(root: Path) -> None:
            _rsync("-aHX", f"{src}/", str(root / "r"))
            (src / "src" / "pkg" / "m5.py").write_text("changed\n" * 700)
            os.remove(src / "src" / "pkg" / "m6.py")
            (src / "src" / "new.txt").write_text("new\n")
            with open(src / "src" / "big.bin", "r+b") as f:  # a block in the middle of a chunked file
                f.seek(1_000_000)
                f.write(b"Z" * 5000)
            st = os.stat(src / "src" / "big.bin")  # same size: rsync's quick check looks at whole-second times
            os.utime(src / "src" / "big.bin", ns=(st.st_atime_ns, st.st_mtime_ns + 10**10))
            _rsync("-aHX", "--delete", f"{src}/", str(root / "r"))
            (src / "src" / "pkg" / "m7.py").write_text("in place\n" * 100)
            _rsync("-aHX", "--inplace", f"{src}/", str(root / "r"))
            assert _rsync("-aHXc", "--delete", "--dry-run", "--itemize-changes", f"{src}/", str(root / "r")) == ""
            for name in ("src/big.bin", "src/pkg/m5.py", "src/pkg/m7.py", "src/new.txt"):  # -a kept times
                assert os.stat(root / "r" / name).st_mtime_ns == os.stat(src / name).st_mtime_ns, name
            shutil.rmtree(src)  # the same source again for the other side
            src.mkdir(mode=0o700)
            make_tree(src)

        remote, local = pair
        both(pair, ops)
        assert (remote / "r" / "src" / "hard").stat().st_nlink == 2  # -H kept the hard link
        assert os.getxattr(remote / "r" / "src" / "pkg" / "m4.py", "user.origin") == b"dataset-v1"
        _rsync("-aHX", f"{remote / 'r'}/", str(back))  # the mount as the source
        assert snapshot(back) == snapshot(local / "r")
        assert _rsync("-aHXc", "--dry-run", "--itemize-changes", f"{remote / 'r'}/", str(back)) == ""
    finally:
        shutil.rmtree(src, ignore_errors=True)
        shutil.rmtree(back, ignore_errors=True)


def test_sqlite(pair: tuple[Path, Path]) -> None:
    def ops(root: Path) -> None:
        db = sqlite3.connect(root / "t.db")
        db.execute("create table t (k integer primary key, v text)")
        with db:
            db.executemany("insert into t values (?, ?)", [(i, f"v{i}" * 20) for i in range(3000)])
        with db:
            db.execute("delete from t where k % 3 = 0")
            db.execute("update t set v = 'u' where k % 5 = 0")
        db.execute("vacuum")
        db.close()
        db = sqlite3.connect(root / "t.db")
        (root / "dump.sql").write_text("\n".join(db.iterdump()))
        assert db.execute("pragma integrity_check").fetchone() == ("ok",)
        db.close()

    remote, local = pair
    for root in (local, remote):
        ops(root)
    assert (remote / "dump.sql").read_text() == (local / "dump.sql").read_text()


def test_kill9_then_remount(cluster: LocalCluster) -> None:
    mp = tempfile.mkdtemp(prefix="loomfs-mnt-k9-")
    _mount(cluster, mp)
    (Path(mp) / "kept").write_text("still here")
    pid_file, _ = daemon.state_files(mp)
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    deadline = time.monotonic() + 10
    while True:
        try:
            os.stat(mp)
        except OSError as exc:
            assert exc.errno == errno.ENOTCONN
            break
        assert time.monotonic() < deadline, "the killed mount still answers"
        time.sleep(0.05)
    _mount(cluster, mp)  # clears the stuck mountpoint first
    assert (Path(mp) / "kept").read_text() == "still here"
    (Path(mp) / "kept").unlink()
    _umount(mp)
    os.rmdir(mp)


def test_foreground_unmounts_on_sigterm(cluster: LocalCluster) -> None:
    mp = tempfile.mkdtemp(prefix="loomfs-mnt-fg-")
    proc = subprocess.Popen([*LOOMFS, "--dir", str(cluster.root), "mount", mp, "--foreground",
                             "-o", "loop=separate,attr_timeout=0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not daemon.is_mounted(mp):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        name = f"open-at-exit-{os.getpid()}"
        fd = os.open(Path(mp) / name, os.O_CREAT | os.O_WRONLY)
        os.write(fd, b"bytes")
        assert name in os.listdir(mp)  # readdir's pages bridged to the client's loop
        proc.send_signal(signal.SIGTERM)  # unmounts with the file still open
        assert proc.wait(timeout=30) == 0, proc.stdout.read() if proc.stdout else ""
        assert not daemon.is_mounted(mp)
        with contextlib.suppress(OSError):
            os.close(fd)  # the mount is gone under it (ENOTCONN)
        with loomfs.connect(str(cluster.root)) as fs:
            assert fs.cat(f"/{name}") == b"bytes"  # the daemon closed it on the way out
            fs.unlink(f"/{name}")
    finally:
        if proc.poll() is None:
            proc.kill()
        subprocess.run(["fusermount3", "-u", "-z", mp], capture_output=True)
    os.rmdir(mp)
