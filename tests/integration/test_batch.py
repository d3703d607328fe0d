"""Batch calls on a real cluster: read_many / cat_many, stat_many, put_many, rm_many over mixed
batches (inline files, files in chunks, missing paths, directories, symlinks), thousands of
items in one round trip, replies over a frame's bound, and the blocking API."""

from __future__ import annotations

import dataclasses
import errno
import os
import random
import threading
from typing import Any

import pytest

import loomfs
from loomfs.wire import meta_batch as wb
from loomfs.wire.types import Attr

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

LIMIT = 64 << 10


def inline_dir(fs: loomfs.LoomFS, path: str, limit: int) -> str:
    """A directory whose new files are inline up to ``limit`` bytes (0: never), whatever the
    server's default."""
    fs.makedirs(path, exist_ok=True)
    cur = fs.get_layout(path)
    assert cur is not None
    fs.set_layout(path, dataclasses.replace(cur, chains=[], inline_max_bytes=limit))
    return path


def errnos(results: list[object]) -> list[int | None]:
    return [r.errno if isinstance(r, OSError) else None for r in results]


def test_mixed_batch_of_inline_and_chunked_files(fs: loomfs.LoomFS, base: str, calls: Any) -> None:
    on = inline_dir(fs, f"{base}/on", LIMIT)
    off = inline_dir(fs, f"{base}/off", 0)
    tiny = inline_dir(fs, f"{base}/tiny", 100)
    rng = random.Random(16)
    files: dict[str, bytes] = {f"{on}/s{i}": rng.randbytes(rng.randint(0, 8000)) for i in range(30)}
    files[f"{on}/edge"] = rng.randbytes(LIMIT)
    files[f"{on}/over"] = rng.randbytes(LIMIT + 1)  # past the limit: written in chunks
    files[f"{on}/big"] = rng.randbytes((4 << 20) + 12345)  # two chunks
    files.update({f"{off}/s{i}": rng.randbytes(1000 + i) for i in range(5)})  # meta answers: fallback
    files[f"{off}/big"] = rng.randbytes(300_000)
    files[f"{tiny}/fits"] = b"t" * 100
    files[f"{tiny}/not"] = b"t" * 101
    assert fs.put_many(files) == [None] * len(files)
    fs.symlink(f"{on}/s0", f"{base}/link")

    names = list(files)
    paths = [*names, f"{base}/link", on, f"{base}/missing", f"{on}/s0/x", f"{base}/nodir/f"]
    calls.methods.clear()
    got = fs.read_many(paths)
    assert got[: len(names)] == [files[p] for p in names]
    assert got[len(names)] == files[f"{on}/s0"]
    assert errnos(got[len(names) + 1 :]) == [errno.EISDIR, errno.ENOENT, errno.ENOTDIR, errno.ENOENT]
    assert isinstance(got[-1], FileNotFoundError) and got[-1].filename == f"{base}/nodir/f"
    assert calls.methods.count("read_many") == 1 and "open" not in calls.methods and "read" in calls.methods

    attrs = fs.run(fs.client.stat_many(names))
    inline = {p for p, a in zip(names, attrs, strict=True) if isinstance(a, Attr) and a.inline}
    assert inline == {p for p in names if p.startswith(f"{on}/s")} | {f"{on}/edge", f"{tiny}/fits"}
    sts = fs.stat_many([*names, f"{base}/missing"])
    assert [s.st_size for s in sts[:-1] if isinstance(s, os.stat_result)] == [len(files[p]) for p in names]
    assert isinstance(sts[-1], FileNotFoundError)
    lst = fs.stat_many([f"{base}/link"], follow_symlinks=False)[0]
    assert isinstance(lst, os.stat_result) and lst.st_size == len(f"{on}/s0")

    # the inline files only: one meta round trip, no storage
    calls.methods.clear()
    small = [p for p in names if p in inline]
    assert fs.read_many(small) == [files[p] for p in small]
    assert calls.methods == ["read_many"]

    removed = fs.rm_many([*names, f"{base}/link", on, f"{base}/missing", names[0]])
    assert errnos(removed) == [None] * (len(names) + 1) + [errno.EISDIR, errno.ENOENT, errno.ENOENT]
    assert fs.exists(f"{on}/s0") is False and fs.exists(on)
    assert set(errnos(fs.read_many(names))) == {errno.ENOENT}


def test_thousands_of_files_in_one_round_trip_each(fs: loomfs.LoomFS, base: str, calls: Any) -> None:
    d = inline_dir(fs, f"{base}/many", LIMIT)
    n = 1500
    files = {f"{d}/f{i:05d}": os.urandom(1024) for i in range(n)}
    calls.methods.clear()
    assert fs.put_many(files) == [None] * n
    assert calls.methods == ["put_many"]
    paths = list(files)
    calls.methods.clear()
    assert fs.read_many(paths) == list(files.values())
    assert calls.methods == ["read_many"]
    calls.methods.clear()
    sts = fs.stat_many(paths)
    assert all(isinstance(s, os.stat_result) and s.st_size == 1024 for s in sts)
    assert calls.methods == ["stat_many"]
    assert sorted(fs.listdir(d)) == sorted(p.rsplit("/", 1)[1] for p in paths)
    calls.methods.clear()
    assert fs.rm_many(paths) == [None] * n
    assert calls.methods == ["unlink_many"]
    assert fs.listdir(d) == []


def test_more_bytes_than_one_reply_holds(fs: loomfs.LoomFS, base: str, calls: Any) -> None:
    d = inline_dir(fs, f"{base}/fat", LIMIT)
    n = wb.READ_MANY_DATA_BYTES_MAX // LIMIT + 40
    files = {f"{d}/f{i}": random.Random(i).randbytes(LIMIT) for i in range(n)}
    assert fs.put_many(files) == [None] * n
    calls.methods.clear()
    assert fs.read_many(list(files)) == list(files.values())
    assert calls.methods == ["read_many", "read_many"]  # the first reply answered a prefix


def test_blocking_api(fs: loomfs.LoomFS, base: str) -> None:
    d = inline_dir(fs, f"{base}/b", LIMIT)
    assert fs.put_many([(f"{d}/x", b"1"), (f"{d}/y", b"2"), (f"{d}/x", b"3")]) == [None, None, None]
    assert fs.cat_many([f"{d}/x", f"{d}/y"]) == {f"{d}/x": b"3", f"{d}/y": b"2"}
    with pytest.raises(FileNotFoundError):
        fs.cat_many([f"{d}/x", f"{d}/nope"])
    assert fs.put_many({}) == [] and fs.read_many([]) == [] and fs.stat_many([]) == [] and fs.rm_many([]) == []
    assert errnos(fs.put_many({f"{d}/nope/z": b"", f"{d}/ok": b""})) == [errno.ENOENT, None]
    assert fs.cat(f"{d}/ok") == b""
    assert fs.run(fs.client.read_many([f"{d}/y"])) == [b"2"]

    # many threads at once through the one client
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            mine = {f"{d}/t{k}_{i}": bytes([k]) * (i + 1) for i in range(50)}
            assert fs.put_many(mine) == [None] * 50
            assert fs.read_many(list(mine)) == list(mine.values())
            assert fs.rm_many(list(mine)) == [None] * 50
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
