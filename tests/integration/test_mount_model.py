"""Model-based test through a real mount: random POSIX calls (paths and descriptors held
across steps: unlink and rename while open, O_APPEND, pread/pwrite, ftruncate, links,
symlinks, chmod, user.* extended attributes) applied to a local directory and to the mount with the same ``os`` calls;
results (bytes, sizes, link counts, types, modes, listings, errno) must agree, and so must
the two trees after every step."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from test_mount import _mount, _umount, snapshot

from loomfs.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

NAMES = st.sampled_from(["a", "b", "c"])
PATHS = st.lists(NAMES, min_size=1, max_size=3).map(lambda parts: "/".join(parts))
DATA = st.one_of(st.binary(max_size=64), st.integers(1, 300_000).map(lambda n: bytes([n % 251]) * n))
OPEN_FLAGS = st.sampled_from([os.O_RDONLY, os.O_RDWR, os.O_WRONLY | os.O_APPEND, os.O_RDWR | os.O_CREAT,
                              os.O_RDWR | os.O_APPEND | os.O_CREAT])
FDS_MAX = 4
XATTR_NAMES = st.sampled_from(["user.k", "user.é", "user." + "n" * 250])
XATTR_FLAGS = st.sampled_from([0, os.XATTR_CREATE, os.XATTR_REPLACE])


def outcome(fn: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    try:
        return ("ok", fn(*args))
    except OSError as exc:
        return ("err", exc.errno)


def _write(path: str, data: bytes) -> int:
    with open(path, "wb") as f:
        return f.write(data)


def _append(path: str, data: bytes) -> int:
    with open(path, "ab") as f:
        return f.write(data)


def _pwrite(path: str, off: int, data: bytes) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        return os.pwrite(fd, data, off)
    finally:
        os.close(fd)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _lstat(path: str) -> tuple[int, int, int, str]:
    st_ = os.lstat(path)
    size = st_.st_size if not stat.S_ISDIR(st_.st_mode) else 0
    return stat.S_IFMT(st_.st_mode), size, st_.st_nlink, oct(stat.S_IMODE(st_.st_mode))


def _fstat(fd: int) -> tuple[int, int]:
    st_ = os.fstat(fd)
    return (st_.st_size if not stat.S_ISDIR(st_.st_mode) else 0), st_.st_nlink  # a directory's size is the FS's


class MountVsLocal(RuleBasedStateMachine):
    mnt: str

    @initialize()
    def setup(self) -> None:
        self.local = tempfile.mkdtemp(prefix="loomfs-mmodel-")
        self.remote = str(Path(self.mnt) / f"model-{os.path.basename(self.local)}-{time.monotonic_ns()}")
        os.mkdir(self.remote)
        self.fds: list[tuple[int, int, str]] = []  # (local fd, mount fd, path)

    def teardown(self) -> None:
        for lfd, rfd, _ in getattr(self, "fds", []):
            os.close(lfd)
            os.close(rfd)
        shutil.rmtree(self.local, ignore_errors=True)

    def both(self, fn: Callable[..., Any], *paths_then_args: Any, n_paths: int = 1) -> tuple[str, Any]:
        paths, rest = paths_then_args[:n_paths], paths_then_args[n_paths:]
        lo = outcome(fn, *(os.path.join(self.local, p) for p in paths), *rest)
        ro = outcome(fn, *(os.path.join(self.remote, p) for p in paths), *rest)
        assert lo == ro, f"{fn.__name__}{paths_then_args!r:.120}: local={lo!r:.200} mount={ro!r:.200}"
        return lo

    def each_fd(self, i: int, fn: Callable[..., Any], *args: Any) -> None:
        lfd, rfd, path = self.fds[i % len(self.fds)]
        lo, ro = outcome(fn, lfd, *args), outcome(fn, rfd, *args)
        assert lo == ro, f"{fn.__name__} on {path} {args!r:.80}: local={lo!r:.200} mount={ro!r:.200}"

    # --- paths ----------------------------------------------------------------------------

    @rule(p=PATHS)
    def mkdir(self, p: str) -> None:
        self.both(os.mkdir, p)

    @rule(p=PATHS, data=DATA)
    def write(self, p: str, data: bytes) -> None:
        self.both(_write, p, data)

    @rule(p=PATHS, data=st.binary(min_size=1, max_size=5000))
    def append(self, p: str, data: bytes) -> None:
        self.both(_append, p, data)

    @rule(p=PATHS, off=st.integers(0, 400_000), data=st.binary(min_size=1, max_size=3000))
    def pwrite(self, p: str, off: int, data: bytes) -> None:
        self.both(_pwrite, p, off, data)

    @rule(p=PATHS)
    def read(self, p: str) -> None:
        self.both(_read, p)

    @rule(p=PATHS, size=st.integers(0, 400_000))
    def truncate(self, p: str, size: int) -> None:
        self.both(os.truncate, p, size)

    @rule(p=PATHS)
    def unlink(self, p: str) -> None:
        self.both(os.unlink, p)

    @rule(p=PATHS)
    def rmdir(self, p: str) -> None:
        self.both(os.rmdir, p)

    @rule(a=PATHS, b=PATHS)
    def rename(self, a: str, b: str) -> None:
        self.both(os.rename, a, b, n_paths=2)

    @rule(a=PATHS, b=PATHS)
    def link(self, a: str, b: str) -> None:
        self.both(os.link, a, b, n_paths=2)

    @rule(dest=st.sampled_from(["a", "b/c", "x/y", "c"]), p=PATHS)  # never out of the roots
    def symlink(self, dest: str, p: str) -> None:
        lo = outcome(os.symlink, dest, os.path.join(self.local, p))
        ro = outcome(os.symlink, dest, os.path.join(self.remote, p))
        assert lo == ro

    @rule(p=PATHS, mode=st.sampled_from([0o600, 0o644, 0o755, 0o700]))
    def chmod(self, p: str, mode: int) -> None:
        self.both(os.chmod, p, mode)

    @rule(p=PATHS)
    def lstat(self, p: str) -> None:
        self.both(_lstat, p)

    @rule(p=st.one_of(st.just(""), PATHS))
    def listdir(self, p: str) -> None:
        self.both(lambda path: sorted(os.listdir(path)), p)

    # --- extended attributes (user.*; the mount's virtual user.loomfs.layout is never listed) --

    @rule(p=PATHS, name=XATTR_NAMES, value=st.binary(max_size=300), flags=XATTR_FLAGS, follow=st.booleans())
    def setxattr(self, p: str, name: str, value: bytes, flags: int, follow: bool) -> None:
        self.both(lambda path: os.setxattr(path, name, value, flags, follow_symlinks=follow), p)

    @rule(p=PATHS, name=XATTR_NAMES)
    def getxattr(self, p: str, name: str) -> None:
        self.both(os.getxattr, p, name)

    @rule(p=PATHS, name=XATTR_NAMES, follow=st.booleans())
    def removexattr(self, p: str, name: str, follow: bool) -> None:
        self.both(lambda path: os.removexattr(path, name, follow_symlinks=follow), p)

    @rule(p=PATHS, follow=st.booleans())
    def listxattr(self, p: str, follow: bool) -> None:
        self.both(lambda path: sorted(os.listxattr(path, follow_symlinks=follow)), p)

    # --- descriptors held across steps -------------------------------------------------------

    @precondition(lambda self: len(self.fds) < FDS_MAX)
    @rule(p=PATHS, flags=OPEN_FLAGS)
    def open_fd(self, p: str, flags: int) -> None:
        lo = outcome(os.open, os.path.join(self.local, p), flags, 0o644)
        ro = outcome(os.open, os.path.join(self.remote, p), flags, 0o644)
        if lo[0] == "ok" and ro[0] == "ok":
            self.fds.append((lo[1], ro[1], p))
            return
        for kind, fd in (lo, ro):
            if kind == "ok":
                os.close(fd)
        assert lo == ro

    @precondition(lambda self: self.fds)
    @rule(i=st.integers(0, FDS_MAX), data=st.binary(min_size=1, max_size=4000))
    def fd_write(self, i: int, data: bytes) -> None:
        self.each_fd(i, os.write, data)

    @precondition(lambda self: self.fds)
    @rule(i=st.integers(0, FDS_MAX), off=st.integers(0, 300_000), data=st.binary(min_size=1, max_size=4000))
    def fd_pwrite(self, i: int, off: int, data: bytes) -> None:
        self.each_fd(i, os.pwrite, data, off)  # with O_APPEND: appends (Linux)

    @precondition(lambda self: self.fds)
    @rule(i=st.integers(0, FDS_MAX), off=st.integers(0, 300_000), n=st.integers(0, 70_000))
    def fd_pread(self, i: int, off: int, n: int) -> None:
        self.each_fd(i, os.pread, n, off)

    @precondition(lambda self: self.fds)
    @rule(i=st.integers(0, FDS_MAX))
    def fd_fstat(self, i: int) -> None:
        self.each_fd(i, _fstat)

    @precondition(lambda self: self.fds)
    @rule(i=st.integers(0, FDS_MAX), size=st.integers(0, 300_000))
    def fd_ftruncate(self, i: int, size: int) -> None:
        self.each_fd(i, os.ftruncate, size)  # also after the last unlink (loomfs.mount.orphans)

    @precondition(lambda self: self.fds)
    @rule(i=st.integers(0, FDS_MAX), mode=st.sampled_from([0o600, 0o640, 0o604]))
    def fd_fchmod(self, i: int, mode: int) -> None:
        self.each_fd(i, os.fchmod, mode)
        self.each_fd(i, lambda fd: oct(stat.S_IMODE(os.fstat(fd).st_mode)))

    @precondition(lambda self: self.fds)
    @rule(i=st.integers(0, FDS_MAX))
    def close_fd(self, i: int) -> None:
        lfd, rfd, _ = self.fds.pop(i % len(self.fds))
        assert outcome(os.close, lfd) == outcome(os.close, rfd)

    @invariant()
    def trees_match(self) -> None:
        if hasattr(self, "local"):
            assert snapshot(Path(self.remote)) == snapshot(Path(self.local))


@pytest.fixture(scope="module")
def mnt(cluster: LocalCluster) -> Iterator[str]:
    mp = tempfile.mkdtemp(prefix="loomfs-mnt-model-")
    _mount(cluster, mp)
    yield mp
    _umount(mp)
    os.rmdir(mp)


def test_mount_matches_local_directory(mnt: str) -> None:
    MountVsLocal.mnt = mnt
    run_state_machine_as_test(
        MountVsLocal,
        # no shrinking: a failure prints its (at most 25) steps at once, within the timeout
        settings=settings(max_examples=12, stateful_step_count=25, deadline=None, phases=[Phase.generate],
                          suppress_health_check=list(HealthCheck), derandomize=True),
    )
