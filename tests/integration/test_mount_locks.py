"""flock and fcntl locks across two mounts of one cluster (and a native client): held at meta
(loomfs.meta.locks), asked for by the kernel through libfuse's lock requests
(loomfs.mount.lowlevel, loomfs.mount.locks). Exclusion, F_GETLK, blocking waits woken by the
other mount's unlock and ended by a signal, unlock at close and at process exit, and a killed
mount's locks gone one lease later."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_mount import _mount, _umount

import loomfs
from loomfs.client import locks as client_locks
from loomfs.mount import daemon
from loomfs.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

LEASE_S = 3.0  # the mounts' lock lease (a killed mount's locks go this long after)


@pytest.fixture(scope="module")
def two(cluster: LocalCluster) -> Iterator[tuple[str, str]]:
    a = tempfile.mkdtemp(prefix="loomfs-lk-a-")
    b = tempfile.mkdtemp(prefix="loomfs-lk-b-")
    _mount(cluster, a, "-o", f"lock_lease={LEASE_S}")
    try:
        _mount(cluster, b, "-o", f"lock_lease={LEASE_S}")
        try:
            yield a, b
        finally:
            _umount(b)
    finally:
        _umount(a)
        os.rmdir(a)
        os.rmdir(b)


def wait_for(what: str, cond: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def fresh(a: str, b: str, tag: str) -> tuple[Path, Path]:
    name = f"lk-{tag}-{os.getpid()}-{time.monotonic_ns()}"
    (Path(a) / name).write_bytes(b"x" * 4096)
    return Path(a) / name, Path(b) / name


def child(code: str) -> subprocess.Popen[str]:
    """A python process running ``code``; it prints a line at each step."""
    return subprocess.Popen([sys.executable, "-u", "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def expect_line(p: subprocess.Popen[str], want: str) -> None:
    assert p.stdout is not None
    line = p.stdout.readline().strip()
    assert line == want, (line, p.stderr.read() if p.poll() is not None and p.stderr else "")


def flock_n(path: Path) -> int:
    """``flock -n -x path true``'s exit status: 0 taken, 1 refused."""
    return subprocess.run(["flock", "-n", "-x", str(path), "true"], timeout=30).returncode


def getlk(fd: int, type_: int = fcntl.F_WRLCK, start: int = 0, length: int = 0) -> tuple[int, int, int, int]:
    """F_GETLK: (type, start, len, pid) of the lock in the way (type F_UNLCK: none)."""
    got = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack("hhqqi", type_, os.SEEK_SET, start, length, 0))
    t, _, s, n, pid = struct.unpack("hhqqi", got)
    return t, s, n, pid


def stats(mp: str) -> dict[str, int]:
    return dict(json.loads(os.getxattr(mp, "user.loomfs.stats"))["requests"])


def test_flock_excludes_across_mounts_and_goes_at_close(two: tuple[str, str]) -> None:
    a, b = two
    fa, fb = fresh(a, b, "flock")
    fd = os.open(fa, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert flock_n(fb) == 1  # the other mount sees it
        fd2 = os.open(fa, os.O_RDONLY)  # another open file description, same mount
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd2, fcntl.LOCK_SH | fcntl.LOCK_NB)
        os.close(fd2)
        fcntl.flock(fd, fcntl.LOCK_SH)  # downgrade: shared with the other mount
        assert subprocess.run(["flock", "-n", "-s", str(fb), "true"], timeout=30).returncode == 0
        assert flock_n(fb) == 1
    finally:
        os.close(fd)  # the RELEASE drops it (the kernel sends it after close returns)
    wait_for("the released flock to go", lambda: flock_n(fb) == 0)
    assert stats(a)["lock_flock"] >= 2 and stats(a)["lock_release_unlocks"] >= 1


def test_blocking_flock_waits_for_the_other_mount(two: tuple[str, str]) -> None:
    a, b = two
    fa, fb = fresh(a, b, "wait")
    fd = os.open(fa, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    waiter = subprocess.Popen(["flock", "-x", str(fb), "-c", "echo got"], stdout=subprocess.PIPE, text=True)
    try:
        wait_for("the waiter's polls", lambda: stats(b).get("lock_flock", 0) >= 1)
        assert waiter.poll() is None  # still waiting
        fcntl.flock(fd, fcntl.LOCK_UN)
        out, _ = waiter.communicate(timeout=30)
        assert waiter.returncode == 0 and out.strip() == "got"
    finally:
        if waiter.poll() is None:
            waiter.kill()
        os.close(fd)


def test_posix_ranges_getlk_and_unlock_at_close(two: tuple[str, str]) -> None:
    a, b = two
    fa, fb = fresh(a, b, "posix")
    fd = os.open(fa, os.O_RDWR)
    p = child(
        "import fcntl, os, struct, sys\n"
        f"fd = os.open({str(fb)!r}, os.O_RDWR)\n"
        "def getlk(t, s, n):\n"
        "    r = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack('hhqqi', t, 0, s, n, 0))\n"
        "    return struct.unpack('hhqqi', r)\n"
        "sys.stdin.readline()\n"
        "for s, n in ((105, 1), (90, 20)):\n"
        "    try:\n"
        "        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, n, s)\n"
        "        print('taken', s)\n"
        "    except OSError as e:\n"
        "        print('refused', s, e.errno)\n"
        "fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 110); print('beside')\n"
        "fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB, 10, 300); print('shared')\n"
        "print(*getlk(fcntl.F_WRLCK, 100, 5)[::2])\n"
        "print(*getlk(fcntl.F_WRLCK, 250, 0)[::2])\n"
        "print(*getlk(fcntl.F_RDLCK, 250, 0)[::2])\n"
        "sys.stdin.readline()\n"
    )
    assert p.stdin is not None
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 100)  # bytes 100..109
        fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB, 0, 200)  # 200.. (to the end), shared
        p.stdin.write("go\n")
        p.stdin.flush()
        expect_line(p, "refused 105 11")  # EAGAIN
        expect_line(p, "refused 90 11")
        expect_line(p, "beside")
        expect_line(p, "shared")
        expect_line(p, f"{fcntl.F_WRLCK} 100 0")  # type, start, pid (another node's: 0)
        expect_line(p, f"{fcntl.F_RDLCK} 200 0")
        expect_line(p, f"{fcntl.F_UNLCK} 250 0")  # read locks share
        assert getlk(fd, fcntl.F_WRLCK, 110, 1)[:2] == (fcntl.F_WRLCK, 110)  # the child's, seen from here
        with pytest.raises(OSError):
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 112)
    finally:
        os.close(fd)  # FLUSH with our lock_owner: our ranges go
    fd = os.open(fa, os.O_RDWR)
    try:
        assert getlk(fd, fcntl.F_WRLCK, 100, 10)[0] == fcntl.F_UNLCK  # ours went at the close
        assert getlk(fd, fcntl.F_WRLCK, 110, 1)[0] == fcntl.F_WRLCK  # the child's stay
        p.kill()  # its descriptors close as it dies: its locks go with them
        p.wait(timeout=30)
        wait_for("the dead child's locks to go", lambda: getlk(fd)[0] == fcntl.F_UNLCK)
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 0, 0)
    finally:
        if p.poll() is None:
            p.kill()
        os.close(fd)
    assert stats(a)["lock_flush_unlocks"] >= 1 and stats(b)["lock_flush_unlocks"] >= 1


def test_ofd_locks_conflict_across_mounts_and_go_with_their_open_file(two: tuple[str, str]) -> None:
    a, b = two
    fa, fb = fresh(a, b, "ofd")
    fd = os.open(fa, os.O_RDWR)
    dup = os.dup(fd)
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, 0, 10, 0))
    other = os.open(fb, os.O_RDWR)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.fcntl(other, fcntl.F_OFD_SETLK, struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, 5, 1, 0))
        os.close(fd)  # the description lives on in the dup: so does its lock
        with pytest.raises(BlockingIOError):
            fcntl.fcntl(other, fcntl.F_OFD_SETLK, struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, 5, 1, 0))
        os.close(dup)  # RELEASE (the kernel sends it after close returns): the description's locks go

        def taken() -> bool:
            try:
                fcntl.fcntl(other, fcntl.F_OFD_SETLK, struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, 5, 1, 0))
            except BlockingIOError:
                return False
            return True

        wait_for("the released description's OFD lock to go", taken)
    finally:
        os.close(other)


@pytest.mark.parametrize("size", [4096, 300_000])  # inline (buffered until a sync), in chunks
def test_an_unlock_publishes_the_writes_made_under_the_lock(two: tuple[str, str], cluster: LocalCluster,
                                                            size: int) -> None:
    """A writer keeps its descriptor open: its unlock syncs what it wrote, so another client
    that takes the lock right after and opens the file reads it (no close needed; without the
    sync it read the old bytes: the writer's buffers reach meta later, on their own)."""
    a, b = two
    fa, _ = fresh(a, b, "publish")
    fs = loomfs.connect(str(cluster.root))
    fd = os.open(fa, os.O_RDWR)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX, 0, 0)
        data = os.urandom(size)  # over the whole 4 KiB the file had
        os.pwrite(fd, data, 0)
        fcntl.lockf(fd, fcntl.LOCK_UN, 0, 0)
        path = "/" + fa.name
        fs.run(client_locks.lock(fs.client, path, client_locks.WRITE, kind=client_locks.POSIX, wait=False))
        with fs.open(path, "rb") as f:
            assert f.read() == data
        fs.run(client_locks.unlock(fs.client, path, kind=client_locks.POSIX))
    finally:
        os.close(fd)
        fs.run(client_locks.close_client(fs.client))
        fs.close()


def test_a_blocked_fcntl_wait_ends_with_a_signal(two: tuple[str, str]) -> None:
    a, b = two
    fa, fb = fresh(a, b, "intr")
    fd = os.open(fa, os.O_RDWR)
    fcntl.lockf(fd, fcntl.LOCK_EX, 0, 0)
    before = stats(b).get("lock_setlk", 0)
    p = child(
        "import fcntl, os, signal\n"
        "class Stop(Exception):\n"
        "    pass\n"
        "def stop(*a):\n"
        "    raise Stop\n"  # Python retries a syscall that a signal ended unless its handler raises
        "signal.signal(signal.SIGUSR1, stop)\n"
        f"fd = os.open({str(fb)!r}, os.O_RDWR)\n"
        "print('waiting', flush=True)\n"
        "try:\n"
        "    fcntl.lockf(fd, fcntl.LOCK_EX, 0, 0)\n"
        "    print('taken')\n"
        "except Stop:\n"
        "    print('interrupted')\n"
    )
    try:
        expect_line(p, "waiting")
        wait_for("the child's SETLKW", lambda: stats(b).get("lock_setlk", 0) > before)
        p.send_signal(signal.SIGUSR1)
        expect_line(p, "interrupted")  # the wait ended (EINTR to the kernel, then the handler)
        assert p.wait(timeout=30) == 0
        # nothing of the abandoned wait stays: the lock can go and be taken by the other mount
        fcntl.lockf(fd, fcntl.LOCK_UN, 0, 0)
        q = child(
            "import fcntl, os\n"
            f"fd = os.open({str(fb)!r}, os.O_RDWR)\n"
            "fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 0, 0); print('taken')\n"
        )
        expect_line(q, "taken")
        assert q.wait(timeout=30) == 0
    finally:
        if p.poll() is None:
            p.kill()
        os.close(fd)


def test_a_native_client_and_a_mount_exclude_each_other(two: tuple[str, str], cluster: LocalCluster) -> None:
    a, b = two
    fa, fb = fresh(a, b, "native")
    fs = loomfs.connect(str(cluster.root))
    try:
        path = "/" + fa.name
        fs.run(client_locks.lock(fs.client, path, client_locks.WRITE, wait=False))
        assert flock_n(fb) == 1
        fs.run(client_locks.unlock(fs.client, path))
        assert flock_n(fb) == 0
        fd = os.open(fb, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            with pytest.raises(BlockingIOError):
                fs.run(client_locks.lock(fs.client, path, client_locks.WRITE, wait=False))
            fs.run(client_locks.lock(fs.client, path, client_locks.READ, wait=False))  # shares it
        finally:
            os.close(fd)
        fs.run(client_locks.lock(fs.client, path, client_locks.WRITE, wait=True, wait_max_s=20))
        assert flock_n(fb) == 1
        fs.run(client_locks.locks_of(fs.client).close())  # every lock of the client goes
        assert flock_n(fb) == 0
    finally:
        fs.close()


def test_a_killed_mounts_locks_go_after_its_lease(two: tuple[str, str], cluster: LocalCluster) -> None:
    a, b = two
    c = tempfile.mkdtemp(prefix="loomfs-lk-c-")
    _mount(cluster, c, "-o", f"lock_lease={LEASE_S}")
    fc = Path(c) / fresh(a, b, "killed")[0].name
    fb = Path(b) / fc.name
    holder = subprocess.Popen(["flock", "-x", str(fc), "-c", "echo held; exec sleep 600"], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert flock_n(fb) == 1
        pid_file, _ = daemon.state_files(c)
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
        killed_at = time.monotonic()
        wait_for("the killed mount's lock to expire", lambda: flock_n(fb) == 0, timeout_s=LEASE_S * 10)
        assert time.monotonic() - killed_at >= LEASE_S / 2  # not at once: the lease ran out
    finally:
        holder.kill()
        holder.wait(timeout=30)
        subprocess.run(["fusermount3", "-u", "-z", c], capture_output=True, timeout=30)
        os.rmdir(c)


def test_a_stopped_mount_ends_its_waits_and_drops_its_locks_at_once(two: tuple[str, str],
                                                                     cluster: LocalCluster) -> None:
    """SIGTERM to a mount (a clean stop) while one of its processes holds a lock and another
    waits: the wait ends with ENOLCK (no crash of the daemon answering it), and meta drops the
    mount's locks at once, long before its lease (60 s here) would."""
    a, b = two
    c = tempfile.mkdtemp(prefix="loomfs-lk-c-")
    _mount(cluster, c, "-o", "lock_lease=60")
    name = fresh(a, b, "stopped")[0].name
    fc = Path(c) / name
    holder = subprocess.Popen(["flock", "-x", str(Path(c) / name), "-c", "echo held; exec sleep 600"],
                              stdout=subprocess.PIPE, text=True)
    fd = os.open(Path(a) / name, os.O_RDWR)
    waiter = None
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        fcntl.lockf(fd, fcntl.LOCK_EX, 1, 0)  # mount a holds byte 0
        # counted before the waiter starts: its SETLKW may reach mount c before a later read
        # (a blocked SETLKW sends no further FUSE request, so the count would never rise again)
        before = stats(c).get("lock_setlk", 0)
        waiter = subprocess.Popen([sys.executable, "-c", "import fcntl, os\n"
                                   f"fd = os.open({str(fc)!r}, os.O_RDWR)\n"
                                   "try:\n"
                                   "    fcntl.lockf(fd, fcntl.LOCK_EX, 1, 0)\n"
                                   "except OSError as e:\n"
                                   "    print(e.errno)\n"], stdout=subprocess.PIPE, text=True)
        wait_for("the waiter's SETLKW", lambda: stats(c).get("lock_setlk", 0) > before)
        pid = int(daemon.state_files(c)[0].read_text())
        os.kill(pid, signal.SIGTERM)
        out, _ = waiter.communicate(timeout=30)
        assert out.strip() == str(errno.ENOLCK)

        def gone() -> bool:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            return False

        wait_for("the daemon to exit", gone)
        wait_for("the stopped mount's flock to go", lambda: flock_n(Path(b) / name) == 0, timeout_s=20)
    finally:
        os.close(fd)
        for p in (holder, waiter):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(timeout=30)
        subprocess.run(["fusermount3", "-u", "-z", c], capture_output=True, timeout=30)
        os.rmdir(c)
