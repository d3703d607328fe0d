"""Lock-time revalidation of *write* handles through two mounts of one cluster
(``MountLocks._revalidate``): each node holds one O_RDWR descriptor of a shared file, opened
before any of the writes, and loops lock; read; modify; write; fsync; unlock (the pattern of
SQLite across nodes, a job queue file, an fcntl-locked append log). Without the revalidation
the second node read its kernel's old pages and wrote at the end its client file knew, over
the other node's record."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_mount_lock_revalidate import KINDS
from test_mount_locks import expect_line, fresh, two  # noqa: F401 - two: the module's fixture

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ROUNDS = 8
RECORD_BYTES = 700
# inline: 60 KiB at meta, the records carry it past the 64 KiB inline limit on one node while
# the other holds its handle of the inline file; chunked: the records cross a chunk boundary
BASES = {"inline": 60 << 10, "chunked": (3 << 20) - 5000}


def read_all(fd: int) -> bytes:
    out = bytearray()
    while piece := os.pread(fd, 1 << 20, len(out)):
        out += piece
    return bytes(out)


def locked_read(path: Path, kind: str) -> bytes:
    """The file as a new descriptor reads it under a shared lock (a plain open may see the
    size the kernel cached, up to attr_timeout old, after the other node's last write)."""
    lock, unlock = KINDS[kind]
    fd = os.open(path, os.O_RDONLY)
    try:
        lock(fd, False)
        try:
            return read_all(fd)
        finally:
            unlock(fd)
    finally:
        os.close(fd)


def record(node: str, i: int) -> bytes:
    return f"{node}{i:03d}".encode().ljust(RECORD_BYTES - 1, b".") + b"\n"


@pytest.mark.parametrize("how", ["pwrite", "append"])
@pytest.mark.parametrize("base", sorted(BASES))
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_two_nodes_append_records_under_a_lock(two: tuple[str, str], kind: str, base: str, how: str) -> None:  # noqa: F811
    lock, unlock = KINDS[kind]
    a, b = two
    pa, pb = fresh(a, b, f"rw-{kind}-{base}-{how}")
    head = b"h" * BASES[base]
    pa.write_bytes(head)
    flags = os.O_RDWR | (os.O_APPEND if how == "append" else 0)
    fds = {"A": os.open(pa, flags), "B": os.open(pb, flags)}
    try:
        for fd in fds.values():  # the kernel's pages and the client files hold the head
            assert read_all(fd) == head
        want = head
        for i in range(ROUNDS):
            for node, fd in fds.items():
                lock(fd, True)
                try:
                    got = read_all(fd)
                    assert got == want, (node, i, len(got), len(want), got[-RECORD_BYTES:][:4])
                    rec = record(node, i)
                    if how == "append":
                        assert os.write(fd, rec) == len(rec)
                    else:
                        assert os.pwrite(fd, rec, len(got)) == len(rec)
                    os.fsync(fd)
                    want = got + rec
                finally:
                    unlock(fd)
    finally:
        for fd in fds.values():
            os.close(fd)
    assert len(want) == len(head) + 2 * ROUNDS * RECORD_BYTES
    for p in (pa, pb):
        assert locked_read(p, kind) == want


COUNTER = textwrap.dedent("""
    import fcntl, os, sys
    path, kind, rounds, at = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    fd = os.open(path, os.O_RDWR)
    os.pread(fd, 64, at)  # the kernel's pages hold the old value
    print("ready", flush=True)
    sys.stdin.readline()
    for _ in range(rounds):
        if kind == "flock":
            fcntl.flock(fd, fcntl.LOCK_EX)
        else:
            fcntl.lockf(fd, fcntl.LOCK_EX)
        value = int(os.pread(fd, 1 << 16, at).split(b".")[0])
        # the number, then as many dots: the file's length changes every round
        new = str(value + 1).encode() + b"." * (value + 1)
        os.pwrite(fd, new, at)
        os.ftruncate(fd, at + len(new))
        os.fsync(fd)
        if kind == "flock":
            fcntl.flock(fd, fcntl.LOCK_UN)
        else:
            fcntl.lockf(fd, fcntl.LOCK_UN)
    os.close(fd)
    print("done", flush=True)
""")
# where the number lives: an inline file's start; across a chunk boundary of a file in chunks
COUNTER_AT = {"inline": 0, "chunked": (3 << 20) - 2}


@pytest.mark.parametrize("base", sorted(COUNTER_AT))
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_two_nodes_increment_a_counter_under_a_lock(two: tuple[str, str], kind: str, base: str) -> None:  # noqa: F811
    """Two processes, one per mount, each add 1 to the number in the file N times at once,
    under a blocking lock: the file ends at 2N."""
    a, b = two
    pa, pb = fresh(a, b, f"count-{kind}-{base}")
    at = COUNTER_AT[base]
    pa.write_bytes(b"c" * at + b"0")
    rounds = 15
    procs: list[subprocess.Popen[str]] = []
    try:
        for path in (pa, pb):
            p = subprocess.Popen([sys.executable, "-u", "-c", COUNTER, str(path), kind, str(rounds), str(at)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            procs.append(p)
            expect_line(p, "ready")
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0 and out.strip() == "done", err
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    total = 2 * rounds
    for path in (pa, pb):  # under the lock: a plain open may see the size the kernel cached
        data = locked_read(path, kind)  # within attr_timeout (the other node's last rounds)
        assert data[at:] == str(total).encode() + b"." * total, data[at:at + 20]
        assert data[:at] == b"c" * at


@pytest.mark.parametrize("base", sorted(BASES))
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_an_append_after_the_other_node_truncated(two: tuple[str, str], kind: str, base: str) -> None:  # noqa: F811
    """Node B's O_APPEND descriptor knew a long file (its kernel's size, its client file's
    length); node A cuts it short under the lock and writes a little; B takes the lock and
    appends without reading first: the record goes at the new end (no hole, nothing over)."""
    lock, unlock = KINDS[kind]
    a, b = two
    pa, pb = fresh(a, b, f"cut-{kind}-{base}")
    pa.write_bytes(b"h" * BASES[base])
    fa = os.open(pa, os.O_RDWR)
    fb = os.open(pb, os.O_RDWR | os.O_APPEND)
    try:
        assert len(read_all(fb)) == BASES[base]
        assert os.fstat(fb).st_size == BASES[base]
        lock(fa, True)
        os.ftruncate(fa, 100)
        os.pwrite(fa, b"A" * 10, 100)
        os.fsync(fa)
        unlock(fa)
        lock(fb, True)
        rec = record("B", 0)
        assert os.write(fb, rec) == len(rec)
        os.fsync(fb)
        unlock(fb)
        want = b"h" * 100 + b"A" * 10 + rec
        assert read_all(fb) == want
        lock(fa, False)  # A sees B's record once it takes the lock
        assert read_all(fa) == want
        unlock(fa)
    finally:
        os.close(fa)
        os.close(fb)
    assert locked_read(pa, kind) == want and locked_read(pb, kind) == want


@pytest.mark.parametrize("base", sorted(BASES))
def test_writes_buffered_before_the_lock_are_kept_and_shared_descriptors_follow(
        two: tuple[str, str], base: str) -> None:  # noqa: F811
    """Node B writes (no fsync) before it locks: the lock sends those bytes out before the
    revalidation reopens B's file (nothing lost), and B's second descriptor, which shares the
    client file, reads and writes meta's file from then on too."""
    lock, unlock = KINDS["fcntl"]
    a, b = two
    pa, pb = fresh(a, b, f"dirty-{base}")
    size = BASES[base]
    pa.write_bytes(b"h" * size)
    fa = os.open(pa, os.O_RDWR)
    fb, fb2 = os.open(pb, os.O_RDWR), os.open(pb, os.O_RDWR)
    try:
        assert len(read_all(fb2)) == size
        lock(fa, True)
        os.pwrite(fa, b"A" * 1000, size)  # grows it: B's files knew the old length
        os.fsync(fa)
        unlock(fa)
        os.pwrite(fb, b"B" * 10, 0)  # buffered at B, not synced
        lock(fb, True)
        want = b"B" * 10 + b"h" * (size - 10) + b"A" * 1000
        assert read_all(fb) == want and read_all(fb2) == want
        os.pwrite(fb2, b"C" * 10, len(want))  # at the end B's files know now
        unlock(fb)
        want += b"C" * 10
        assert locked_read(pa, "fcntl") == want
    finally:
        for fd in (fa, fb, fb2):
            os.close(fd)
