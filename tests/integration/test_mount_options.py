"""Mount options through real mounts: the kernel page cache per open (kept for an unchanged
file, dropped when another client changed it, never with cache=none), direct_io and O_DIRECT,
read-only mounts. Whether pages are resident is asked of the kernel (mincore on a mapping)."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_mount import _mount, _umount

import loomfs
from loomfs.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
PAGE = mmap.PAGESIZE


@contextlib.contextmanager
def mounted(cluster: LocalCluster, *opts: str) -> Iterator[Path]:
    mp = tempfile.mkdtemp(prefix="loomfs-mnt-opt-")
    _mount(cluster, mp, *opts)
    try:
        yield Path(mp)
    finally:
        _umount(mp)
        os.rmdir(mp)


def resident_pages(path: Path) -> int:
    """How many of ``path``'s pages the kernel holds now (mincore over a private mapping of
    it; mapping and asking read nothing)."""
    libc = ctypes.CDLL(None, use_errno=True)
    size = path.stat().st_size
    n = (size + PAGE - 1) // PAGE
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as m:
        vec = (ctypes.c_ubyte * n)()
        anchor = ctypes.c_char.from_buffer(m)
        try:
            rc = libc.mincore(ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(size), vec)
            assert rc == 0, os.strerror(ctypes.get_errno())
        finally:
            del anchor
        return sum(v & 1 for v in vec)


def _read_through(path: Path) -> bytes:
    with open(path, "rb", buffering=0) as f:
        return f.read()


def test_page_cache_kept_while_unchanged_dropped_when_changed(cluster: LocalCluster) -> None:
    """auto (strict): an unchanged file's pages survive the next open; a change another client
    closed drops them and the new bytes are read (close-to-open)."""
    data = os.urandom(64 * PAGE)
    with mounted(cluster) as mp, loomfs.connect(str(cluster.root)) as fs:
        name = f"/cache-{os.getpid()}-{time.monotonic_ns()}"
        fs.pipe(name, data)
        p = mp / name[1:]
        assert _read_through(p) == data
        assert resident_pages(p) == 64  # kept at the open mincore's mapping did
        new = os.urandom(64 * PAGE)
        with fs.open(name, "r+b") as f:  # another client: same size, new bytes
            f.write(new)
        assert _read_through(p) == new
        fs.unlink(name)


def test_cache_none_and_direct_io(cluster: LocalCluster) -> None:
    data = os.urandom(32 * PAGE)
    with mounted(cluster, "-o", "cache=none") as mp:
        p = mp / f"none-{os.getpid()}"
        p.write_bytes(data)
        assert _read_through(p) == data
        assert resident_pages(p) == 0  # the open for mincore's mapping dropped them
        p.unlink()
    with mounted(cluster, "-o", "direct_io") as mp:
        p = mp / f"direct-{os.getpid()}"
        p.write_bytes(data)
        assert _read_through(p) == data
        fd = os.open(p, os.O_RDONLY)
        try:
            assert os.pread(fd, 10, 5) == data[5:15]
        finally:
            os.close(fd)
        assert resident_pages(p) == 0  # nothing goes through the page cache
        p.unlink()


def test_direct_read(cluster: LocalCluster) -> None:
    """direct_read: read-only opens bypass the page cache (a shared mapping of one is refused,
    a private one works); a write open still goes through it."""
    import json

    data = os.urandom(3 << 20)
    with mounted(cluster, "-o", "direct_read") as mp:
        p = mp / f"dread-{os.getpid()}"
        p.write_bytes(data)
        assert _read_through(p) == data
        assert resident_pages(p) == 0  # the read left nothing cached (mincore's open is read-only too)
        with open(p, "rb") as f:
            with pytest.raises(OSError) as exc:
                mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            assert exc.value.errno == errno.ENODEV
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) as m:
                assert m[:4096] == data[:4096]
        with open(p, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:  # a write open: page cache, shared maps
            m[:4] = b"ABCD"
        assert p.read_bytes()[:8] == b"ABCD" + data[4:8]
        stats = json.loads(os.getxattr(mp, "user.loomfs.stats"))
        assert stats["read_prefetched"] > 0  # the direct reads are a sequential stream too
        p.unlink()


def test_o_direct(cluster: LocalCluster) -> None:
    with mounted(cluster) as mp:
        p = mp / f"odirect-{os.getpid()}"
        buf = mmap.mmap(-1, 4 * PAGE)  # page-aligned, as O_DIRECT callers do
        buf.write(os.urandom(4 * PAGE))
        fd = os.open(p, os.O_CREAT | os.O_RDWR | os.O_DIRECT, 0o644)
        try:
            assert os.write(fd, buf) == 4 * PAGE
            back = mmap.mmap(-1, 4 * PAGE)
            assert os.preadv(fd, [back], 0) == 4 * PAGE
            assert back[:] == buf[:]
        finally:
            os.close(fd)
        assert p.read_bytes() == buf[:]
        p.unlink()


def test_read_only(cluster: LocalCluster) -> None:
    name = f"ro-{os.getpid()}"
    with loomfs.connect(str(cluster.root)) as fs:
        fs.pipe(f"/{name}", b"kept")
    with mounted(cluster, "-o", "ro") as mp:
        assert (mp / name).read_bytes() == b"kept"
        for fn in (lambda: (mp / name).write_bytes(b"x"), lambda: (mp / "new").write_bytes(b""),
                   lambda: os.mkdir(mp / "d"), lambda: os.unlink(mp / name),
                   lambda: os.chmod(mp / name, 0o600), lambda: os.rename(mp / name, mp / "n2")):
            with pytest.raises(OSError) as exc:
                fn()
            assert exc.value.errno == errno.EROFS
    with loomfs.connect(str(cluster.root)) as fs:
        assert fs.cat(f"/{name}") == b"kept"
        fs.unlink(f"/{name}")


def test_relaxed_mount_keeps_pages(cluster: LocalCluster) -> None:
    data = os.urandom(16 * PAGE)
    with mounted(cluster, "-o", "consistency=relaxed,cache=auto") as mp:
        p = mp / f"relaxed-{os.getpid()}"
        p.write_bytes(data)
        assert _read_through(p) == data
        assert _read_through(p) == data
        assert resident_pages(p) == 16
        p.unlink()


def test_uid_gid_maps(cluster: LocalCluster) -> None:
    """Local 65534 is stored as 4242 (and shown back as 65534); unmapped ids pass as they are."""
    top = f"/idmap-{os.getpid()}"
    with loomfs.connect(str(cluster.root)) as fs:
        fs.mkdir(top)
        fs.chmod(top, 0o777)
        fs.pipe(f"{top}/theirs", b"t")
        fs.chown(f"{top}/theirs", 4242, 4343)
    with mounted(cluster, "-o", "uid_map=65534:4242,gid_map=65534:4343,allow_other") as mp:
        d = mp / top[1:]
        st = os.stat(d / "theirs")
        assert (st.st_uid, st.st_gid) == (65534, 65534)
        os.chown(d / "theirs", 65534, 0)
        made = subprocess.run(
            [sys.executable, "-c", "import os, sys; os.setgid(65534); os.setuid(65534); "
             "open(sys.argv[1] + '/mine', 'w').write('m'); open(sys.argv[1] + '/theirs', 'a').write('+')", str(d)],
            capture_output=True, text=True, timeout=60)
        assert made.returncode == 0, made.stderr  # 65534 owns 'theirs' here: it may write it
        assert (os.stat(d / "mine").st_uid, os.stat(d / "mine").st_gid) == (65534, 65534)
    with loomfs.connect(str(cluster.root)) as fs:
        a, b = fs.stat(f"{top}/theirs"), fs.stat(f"{top}/mine")
        assert (a.st_uid, a.st_gid, b.st_uid, b.st_gid) == (4242, 0, 4242, 4343)
        assert fs.cat(f"{top}/theirs") == b"t+"
        fs.rm(top, recursive=True)


def _bdi_read_ahead_kb(mp: Path) -> int:
    with open("/proc/self/mountinfo") as f:
        dev = [line.split()[2] for line in f if line.split()[4] == str(mp)][-1]
    return int(Path(f"/sys/class/bdi/{dev}/read_ahead_kb").read_text())


def test_read_requests_are_read_ahead_sized(cluster: LocalCluster) -> None:
    """The mount's bdi read-ahead outlives FUSE's INIT (whose reply lowers it to 128 KiB) and
    the kernel sends 1 MiB reads (counted by the mount: user.loomfs.stats); read_ahead_kb=256
    gives 256 KiB ones."""
    import json

    data = os.urandom(6 << 20)
    for opts, kb in (((), 1024), (("-o", "read_ahead_kb=256"), 256)):
        with mounted(cluster, *opts) as mp:
            p = mp / f"ra-{os.getpid()}-{kb}"
            with loomfs.connect(str(cluster.root)) as fs:
                fs.pipe(f"/{p.name}", data)
            assert _bdi_read_ahead_kb(mp) == kb
            assert _read_through(p) == data
            stats = json.loads(os.getxattr(mp, "user.loomfs.stats"))
            sizes = {int(k): v for k, v in stats["read_sizes"].items()}
            assert max(sizes) == kb << 10, sizes
            assert stats["read_bytes"] >= len(data)
            assert stats["requests"]["read"] == sum(sizes.values())
            p.unlink()


def test_prefetched_reads(cluster: LocalCluster) -> None:
    """A sequential reader is served from chunks the mount fetched ahead (counted in
    user.loomfs.stats); a write through the mount in the middle of the stream is what the
    rest of the stream reads; random reads (prefetch_chunks=0 too) read the same bytes."""
    import json
    import random

    for opts in ((), ("-o", "prefetch_chunks=0")):
        with mounted(cluster, *opts) as mp:
            chunk = json.loads(os.getxattr(mp, "user.loomfs.layout"))["chunk_size"]
            size = 3 * chunk + 12345
            data = bytearray(os.urandom(size))
            p = mp / f"pf-{os.getpid()}-{len(opts)}"
            with loomfs.connect(str(cluster.root)) as fs:
                fs.pipe(f"/{p.name}", bytes(data))
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                got = bytearray()
                while len(got) < chunk + 5000:
                    got += os.read(fd, 1 << 20)
                patch = os.urandom(70000)
                at = 2 * chunk - 1000  # ahead of the reader, across a chunk boundary
                wfd = os.open(p, os.O_WRONLY)
                try:
                    assert os.pwrite(wfd, patch, at) == len(patch)
                finally:
                    os.close(wfd)
                data[at:at + len(patch)] = patch
                while b := os.read(fd, 1 << 20):
                    got += b
                assert got == data
                rng = random.Random(7)
                for _ in range(50):
                    off = rng.randrange(size)
                    assert os.pread(fd, 4096, off) == data[off:off + 4096]
            finally:
                os.close(fd)
            stats = json.loads(os.getxattr(mp, "user.loomfs.stats"))
            if opts:
                assert stats["read_prefetched"] == 0
            else:
                assert stats["read_prefetched"] >= chunk // (1 << 20)
            p.unlink()


def test_bench_mount_runs(cluster: LocalCluster) -> None:
    """``loomfs bench --mount``'s code path on tiny sizes: every workload has a figure for
    the mount, the native client and the local directory (speed is not asserted here)."""
    from loomfs.bench.mount import MountPlan, run_mount_bench, table_lines

    plan = MountPlan(big_bytes=2 << 20, rand_count=16, threads=(1, 2), small_files=8)
    local = tempfile.mkdtemp(prefix="loomfs-bench-mount-test-")
    try:
        doc = run_mount_bench(str(cluster.root), plan, local)
    finally:
        os.rmdir(local)
    names = [r["name"] for r in doc["rows"]]
    assert names == ["seq_write", "seq_read", "rand_4k_1t", "rand_4k_2t", "small_create", "small_stat",
                     "small_read"]
    assert all(r[k] > 0 for r in doc["rows"] for k in ("mount", "native", "local"))
    assert len(table_lines(doc)) == 2 + len(names) + 4  # and the big read's CPU per GiB, per target
    cpu = doc["seq_read_cpu_s_per_gib"]
    assert set(cpu) == {"mount", "native", "local"}
    assert {"daemon_user", "daemon_sys", "reader_sys"} <= set(cpu["mount"])
    with loomfs.connect(str(cluster.root)) as fs:
        assert not [n for n in fs.listdir("/.bench") if n.startswith("bench-mount-")]


def test_bench_mount_compares_in_rounds(cluster: LocalCluster) -> None:
    """``loomfs bench --mount --compare DIR --rounds 2 --only small``: the other file system's
    figures beside the mount's, medians over the rounds, each round's mount / compare."""
    from loomfs.bench.mount import MountPlan, run_mount_bench, table_lines

    plan = MountPlan(small_files=6, rounds=2, small_only=True)
    local = tempfile.mkdtemp(prefix="loomfs-bench-mount-test-")
    other = tempfile.mkdtemp(prefix="loomfs-bench-mount-compare-")  # stands in for a MooseFS mount
    try:
        plan.compare_dir = other
        doc = run_mount_bench(str(cluster.root), plan, local)
        assert os.listdir(other) == []  # its files went
    finally:
        os.rmdir(local)
        os.rmdir(other)
    assert [r["name"] for r in doc["rows"]] == ["small_create", "small_stat", "small_read"]
    assert len(doc["rounds"]) == 2
    for r in doc["rows"]:
        assert r["compare"] > 0 and len(r["vs_compare_rounds"]) == 2
        assert r["vs_compare"] == r["mount"] / r["compare"]
    lines = table_lines(doc)
    assert "mount/compare" in lines[1] and lines[-1].startswith("mount / compare per round:")


def test_directory_attributes_after_creates(cluster: LocalCluster) -> None:
    """The kernel asks for a directory's attributes after every create in it; the mount answers
    from meta's last answer (no older than attr_timeout) with the create's times: mtime moves
    with each create, and a change made elsewhere shows once attr_timeout has passed."""
    with mounted(cluster, "-o", "attr_timeout=0.5") as mp:
        d = mp / f"dircache-{os.getpid()}-{time.monotonic_ns()}"
        d.mkdir()
        os.stat(d)
        before = os.stat(d).st_mtime_ns
        (d / "a").write_bytes(b"x")
        after = os.stat(d)
        assert after.st_mtime_ns > before and after.st_ctime_ns >= after.st_mtime_ns - 1
        with loomfs.connect(str(cluster.root)) as fs:
            fs.chmod(f"/{d.name}", 0o700)  # another client
        deadline = time.monotonic() + 10
        n = 0
        while stat.S_IMODE(os.stat(d).st_mode) != 0o700:  # creates go on: they must not keep it stale
            assert time.monotonic() < deadline, "the other client's chmod never showed"
            (d / f"b{n}").write_bytes(b"x")
            n += 1
            time.sleep(0.05)
        assert len(os.listdir(d)) == 1 + n
