"""The on-disk data cache: checks on every read, atomic writes, the byte bound, restarts and
several processes sharing one directory (no sockets, no sleeps)."""

from __future__ import annotations

import multiprocessing
import os
import threading
from pathlib import Path

import pytest

from loomfs.client.cache import DataKey
from loomfs.client.diskcache import HEADER_BYTES, DiskCache


def key(i: int, size: int = 0, version: int = 1) -> DataKey:
    return DataKey(inode=i, size=size, mtime_ns=version, ctime_ns=version)


def entry_files(root: Path) -> list[Path]:
    return sorted(p for p in (root / "v1").rglob("*") if p.is_file())


def test_roundtrip_and_counters(tmp_path: Path) -> None:
    c = DiskCache(tmp_path, 1 << 20, background_evict=False)
    assert c.get(key(1, 5)) is None
    assert c.put(key(1, 5), b"hello")
    assert c.get(key(1, 5)) == b"hello"
    assert c.get(key(1, 5, version=2)) is None  # another version of the file
    assert c.put(key(2, 0), b"")  # an empty file is an entry too
    assert c.get(key(2, 0)) == b""
    assert (c.hits, c.misses, c.hit_bytes, c.writes, c.write_bytes) == (2, 2, 5, 2, 5)
    assert c.bytes == 2 * HEADER_BYTES + 5
    assert list((tmp_path / "tmp").iterdir()) == []  # no temp files left behind
    assert "hits=2" in repr(c)


def test_survives_a_restart(tmp_path: Path) -> None:
    c = DiskCache(tmp_path, 1 << 20)
    c.put(key(1, 3), b"abc")
    c.put(key(2, 3), b"def")
    again = DiskCache(tmp_path, 1 << 20)
    assert again.get(key(1, 3)) == b"abc" and again.get(key(2, 3)) == b"def"
    assert again.bytes == 2 * (HEADER_BYTES + 3)  # found by the scan at start


def test_namespaces_are_apart(tmp_path: Path) -> None:
    a = DiskCache(tmp_path, 1 << 20, namespace="10.0.0.1:8000")
    b = DiskCache(tmp_path, 1 << 20, namespace="10.0.0.2:8000")
    a.put(key(1, 1), b"a")
    assert b.get(key(1, 1)) is None and a.get(key(1, 1)) == b"a"
    assert a.root != b.root and Path(a.root).parent == tmp_path


@pytest.mark.parametrize("damage", ["flip_data", "flip_header", "truncate", "empty", "extend"])
def test_every_read_is_checked(tmp_path: Path, damage: str) -> None:
    c = DiskCache(tmp_path, 1 << 20)
    data = bytes(range(256)) * 4
    c.put(key(1, len(data)), data)
    (path,) = entry_files(tmp_path)
    raw = bytearray(path.read_bytes())
    if damage == "flip_data":
        raw[HEADER_BYTES + 100] ^= 0x10
    elif damage == "flip_header":
        raw[8] ^= 0x01  # the inode field
    elif damage == "truncate":
        raw = raw[:-1]
    elif damage == "empty":
        raw = bytearray()
    else:
        raw += b"x"
    path.write_bytes(bytes(raw))
    assert c.get(key(1, len(data))) is None
    assert c.corrupt == 1 and c.misses == 1
    assert not path.exists()  # a bad entry is removed
    assert c.put(key(1, len(data)), data) and c.get(key(1, len(data))) == data


def test_an_entry_under_the_wrong_name_is_refused(tmp_path: Path) -> None:
    c = DiskCache(tmp_path, 1 << 20)
    c.put(key(1, 3), b"abc")
    (path,) = entry_files(tmp_path)
    wrong = Path(c._path(key(1, 3, version=9)))
    wrong.parent.mkdir(parents=True, exist_ok=True)
    path.rename(wrong)
    assert c.get(key(1, 3, version=9)) is None and c.corrupt == 1


def test_too_large_entries_are_not_stored(tmp_path: Path) -> None:
    c = DiskCache(tmp_path, 1 << 20, entry_bytes_max=10)
    assert not c.put(key(1, 11), b"x" * 11)
    assert c.rejected == 1 and entry_files(tmp_path) == []


def test_the_byte_bound_evicts_least_recently_used(tmp_path: Path) -> None:
    size = 1000
    entry = HEADER_BYTES + size
    c = DiskCache(tmp_path, 10 * entry, touch_interval_s=0, background_evict=False)
    for i in range(10):
        c.put(key(i, size), bytes([i]) * size)
        os.utime(c._path(key(i, size)), (1000 + i, 1000 + i))  # entry i written at time i
    assert c.evictions == 0 and c.bytes == 10 * entry
    assert c.get(key(0, size)) is not None  # a hit makes entry 0 the youngest
    c.put(key(10, size), b"x" * size)  # over the bound: down to 90%
    assert c.evictions == 2 and c.evicted_bytes == 2 * entry
    assert c.bytes == 9 * entry
    assert c.get(key(1, size)) is None and c.get(key(2, size)) is None
    assert c.get(key(0, size)) is not None and c.get(key(10, size)) is not None
    assert sum(p.stat().st_size for p in entry_files(tmp_path)) == 9 * entry


def test_rescans_see_other_processes_writes(tmp_path: Path) -> None:
    """Each process rescans after writing a sixteenth of the bound, so the total others wrote
    is found and brought down."""
    entry = HEADER_BYTES + 100
    bound = 64 * entry
    a = DiskCache(tmp_path, bound, background_evict=False)
    b = DiskCache(tmp_path, bound, background_evict=False)
    for i in range(100):  # b alone would not know a wrote all this
        a.put(key(i, 100), b"a" * 100)
    assert a.scans >= 2
    total = sum(p.stat().st_size for p in entry_files(tmp_path))
    assert total <= bound
    for i in range(100, 105):
        b.put(key(i, 100), b"b" * 100)
    b.evict()
    assert b.bytes == sum(p.stat().st_size for p in entry_files(tmp_path)) <= bound


def test_stale_temp_files_are_swept(tmp_path: Path) -> None:
    c = DiskCache(tmp_path, 1 << 20, background_evict=False)
    stale = tmp_path / "tmp" / "dead-writer.123.abc"
    fresh = tmp_path / "tmp" / "live-writer.456.def"
    stale.write_bytes(b"half")
    fresh.write_bytes(b"half")
    os.utime(stale, (1, 1))
    c.evict()
    assert not stale.exists() and fresh.exists()


def test_eviction_in_the_background(tmp_path: Path) -> None:
    entry = HEADER_BYTES + 100
    c = DiskCache(tmp_path, 4 * entry)
    for i in range(8):
        c.put(key(i, 100), b"z" * 100)
    c.join_eviction(10)
    assert c.scans >= 2 and not c._evicting  # the one at start, one or more in the background
    c.evict()
    assert sum(p.stat().st_size for p in entry_files(tmp_path)) <= 4 * entry


def test_clear(tmp_path: Path) -> None:
    c = DiskCache(tmp_path, 1 << 20)
    c.put(key(1, 1), b"a")
    c.clear()
    assert c.get(key(1, 1)) is None and entry_files(tmp_path) == [] and c.bytes == 0


def _worker(root: str, seed: int, rounds: int, bound: int, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    import random

    rng = random.Random(seed)
    c = DiskCache(root, bound, touch_interval_s=0, background_evict=False)
    bad = 0
    for _ in range(rounds):
        i = rng.randrange(64)
        size = 500 + (i * 37) % 3000
        k = key(i, size)
        got = c.get(k)
        if got is None:
            c.put(k, bytes([i]) * size)
        elif got != bytes([i]) * size:
            bad += 1
    out.put((bad, c.corrupt, c.hits, c.write_errors))


def test_several_processes_share_one_directory(tmp_path: Path) -> None:
    """Four processes (like DataLoader workers) read and fill one cache that is small enough
    to evict all the time: nobody ever reads a wrong or torn entry, and the bound holds."""
    bound = 40_000
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue = ctx.Queue()  # type: ignore[type-arg]
    procs = [ctx.Process(target=_worker, args=(str(tmp_path), s, 400, bound, out)) for s in range(4)]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert all(bad == 0 and corrupt == 0 and errors == 0 for bad, corrupt, _hits, errors in results)
    assert sum(hits for _b, _c, hits, _e in results) > 0
    final = DiskCache(tmp_path, bound, background_evict=False)
    final.evict()
    # each process may pass the bound by a sixteenth between its scans
    assert sum(p.stat().st_size for p in entry_files(tmp_path)) <= bound
    assert list((tmp_path / "tmp").iterdir()) == []


def test_bad_bound() -> None:
    with pytest.raises(ValueError):
        DiskCache("/nonexistent-never-created", 0)


def test_put_later_writes_on_the_writer_thread(tmp_path: Path) -> None:
    c = DiskCache(tmp_path, 1 << 20, background_evict=False)
    for i in range(50):
        assert c.put_later(key(i, 10), bytes([i]) * 10)
    assert c.flush(10)
    assert c.writes == 50 and c._queued_bytes == 0
    assert all(c.get(key(i, 10)) == bytes([i]) * 10 for i in range(50))
    assert c.flush(0)  # nothing queued: at once


def test_put_later_drops_when_the_queue_is_full(tmp_path: Path) -> None:
    c = DiskCache(tmp_path, 1 << 20, queue_bytes_max=100, background_evict=False)
    gate = threading.Event()
    real_put = c.put

    def held_put(k: DataKey, data: bytes | bytearray | memoryview) -> bool:
        gate.wait(10)
        return real_put(k, data)

    c.put = held_put  # type: ignore[method-assign]
    assert c.put_later(key(1, 60), b"a" * 60)
    assert not c.put_later(key(2, 60), b"b" * 60)  # 60 queued or being written + 60 > 100
    assert c.dropped == 1
    assert not c.flush(0)
    gate.set()
    assert c.flush(10)
    assert c.get(key(1, 60)) == b"a" * 60 and c.get(key(2, 60)) is None
    assert not c.put_later(key(3, 1 << 21), b"c" * (1 << 21))  # larger than an entry may be
    assert c.rejected == 1
