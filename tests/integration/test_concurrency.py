"""Many clients at once (separate processes), shared and distinct directories, rename/unlink races."""

from __future__ import annotations

import errno
import multiprocessing as mp
import os

import pytest

import loomfs

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def _writer(cluster_dir: str, base: str, worker: int, files: int, q: mp.Queue) -> None:  # type: ignore[type-arg]
    try:
        fs = loomfs.connect(cluster_dir)
        own = f"{base}/own{worker}"
        fs.makedirs(own, exist_ok=True)
        for i in range(files):
            payload = f"{worker}:{i}".encode() * 100
            with fs.open(f"{own}/f{i}", "wb") as f:
                f.write(payload)
            with fs.open(f"{base}/shared/w{worker}-f{i}", "wb") as f:
                f.write(payload)
        fs.close()
        q.put((worker, "ok"))
    except BaseException as exc:  # report to the parent
        q.put((worker, repr(exc)))


def test_many_clients_distinct_and_shared_dirs(cluster, fs: loomfs.LoomFS, base: str) -> None:  # type: ignore[no-untyped-def]
    fs.mkdir(f"{base}/shared")
    ctx = mp.get_context("spawn")
    q: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    workers, files = 6, 25
    procs = [ctx.Process(target=_writer, args=(str(cluster.root), base, w, files, q)) for w in range(workers)]
    for p in procs:
        p.start()
    results = [q.get(timeout=180) for _ in procs]
    for p in procs:
        p.join(30)
    assert sorted(results) == [(w, "ok") for w in range(workers)]
    shared = fs.ls(f"{base}/shared")
    assert len(shared) == workers * files
    for w in range(workers):
        assert len(fs.ls(f"{base}/own{w}")) == files
        for i in (0, files - 1):
            want = f"{w}:{i}".encode() * 100
            assert fs.cat(f"{base}/own{w}/f{i}") == want
            assert fs.cat(f"{base}/shared/w{w}-f{i}") == want


def _racer(cluster_dir: str, base: str, worker: int, rounds: int, q: mp.Queue) -> None:  # type: ignore[type-arg]
    """Each worker renames the same hot names around and unlinks them; only errno races allowed."""
    import random

    rng = random.Random(worker)
    fs = loomfs.connect(cluster_dir)
    unexpected = []
    for _ in range(rounds):
        a, b = rng.sample(range(6), 2)
        try:
            op = rng.random()
            if op < 0.4:
                fs.rename(f"{base}/hot{a}", f"{base}/hot{b}")
            elif op < 0.6:
                fs.rm(f"{base}/hot{a}")
            elif op < 0.9:
                with fs.open(f"{base}/hot{a}", "xb") as f:
                    f.write(b"w%d" % worker)
            else:
                fs.rename(f"{base}/d{a}", f"{base}/d{b}", no_replace=True)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.EEXIST, errno.ENOTEMPTY):
                unexpected.append(repr(exc))
    fs.close()
    q.put(unexpected)


def test_rename_unlink_races_keep_namespace_consistent(cluster, fs: loomfs.LoomFS, base: str) -> None:  # type: ignore[no-untyped-def]
    for i in range(3):
        fs.mkdir(f"{base}/d{i}")
    ctx = mp.get_context("spawn")
    q: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    procs = [ctx.Process(target=_racer, args=(str(cluster.root), base, w, 80, q)) for w in range(4)]
    for p in procs:
        p.start()
    errors = [q.get(timeout=180) for _ in procs]
    for p in procs:
        p.join(30)
    assert errors == [[]] * 4
    names = fs.ls(base)
    assert len(names) == len(set(names))
    dirs = [n for n in names if n.rsplit("/", 1)[-1].startswith("d")]
    assert len(dirs) == 3  # renames of directories never lose or duplicate one
    for n in names:
        st = fs.stat(n)
        assert st.st_nlink >= 1
        if n.rsplit("/", 1)[-1].startswith("hot"):
            assert fs.cat(n).startswith(b"w")
    statfs = fs.statfs()
    assert statfs.files >= len([n for n in names if "hot" in n])


def test_threads_share_one_client(fs: loomfs.LoomFS, base: str) -> None:
    from concurrent.futures import ThreadPoolExecutor

    def work(i: int) -> bytes:
        data = os.urandom(300_000 + i)
        with fs.open(f"{base}/t{i}", "wb") as f:
            f.write(data)
        return data

    with ThreadPoolExecutor(8) as ex:
        datas = list(ex.map(work, range(16)))
    for i, d in enumerate(datas):
        assert fs.cat(f"{base}/t{i}") == d
