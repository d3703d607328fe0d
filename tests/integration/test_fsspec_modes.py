"""fsspec file modes against a real cluster: appends and exclusive creates inside a
transaction, where an append starts, ``rm`` with ``maxdepth``, what a pickle keeps (found by
the fsspec bug hunt; each test failed on the code before its fix)."""

# ruff: noqa: F811  (the fixtures imported from the sibling module are the parameters below)
from __future__ import annotations

import asyncio
import errno
import gc
import pickle

import pytest
from test_fsspec import _close_shared_clients, lfs  # noqa: F401 (fixtures: shared clients end with the module)

from loomfs.config import ClientConfig
from loomfs.fsspec import LoomFileSystem
from loomfs.testing import LocalCluster


def _temps(lfs: LoomFileSystem, d: str) -> list[str]:
    return [p for p in lfs.ls(d, detail=False) if ".loomfs-" in p]  # transaction temporaries


def test_transaction_append_keeps_the_file(lfs: LoomFileSystem, base: str) -> None:
    p = f"{base}/log"
    lfs.pipe(p, b"ORIGINAL")
    with lfs.transaction:
        with lfs.open(p, "ab") as f:
            f.write(b"+APP")
    assert lfs.cat(p) == b"ORIGINAL+APP"  # was b"+APP": the temp file replaced the file
    assert _temps(lfs, base) == []


def test_transaction_exclusive_create(lfs: LoomFileSystem, base: str) -> None:
    p = f"{base}/x"
    lfs.pipe(p, b"KEEP")
    with pytest.raises(FileExistsError):
        with lfs.transaction:
            lfs.open(p, "xb")
    assert lfs.cat(p) == b"KEEP"
    q = f"{base}/y"  # made by someone else between the open and the commit
    with pytest.raises(FileExistsError):
        with lfs.transaction:
            with lfs.open(q, "xb") as f:
                f.write(b"MINE")
            lfs.pipe(q, b"THEIRS")
    assert lfs.cat(q) == b"THEIRS"
    assert _temps(lfs, base) == []
    with lfs.transaction:  # a new file commits
        with lfs.open(f"{base}/z", "xb") as f:
            f.write(b"NEW")
        assert not lfs.exists(f"{base}/z")
    assert lfs.cat(f"{base}/z") == b"NEW"


def test_append_starts_at_the_end(lfs: LoomFileSystem, base: str) -> None:
    p = f"{base}/t"
    lfs.pipe(p, b"0123456789")
    with lfs.open(p, "ab") as f:
        assert f.tell() == 10  # as open(p, "ab") and fsspec's memory filesystem
        f.write(b"ab")
        assert f.tell() == 12
    assert lfs.cat(p) == b"0123456789ab"

    async def go() -> int:
        async with await lfs.open_async(p, "ab") as af:
            return af.tell()

    assert asyncio.run(go()) == 12


def test_rm_recursive_maxdepth_removes_only_what_it_finds(lfs: LoomFileSystem, base: str) -> None:
    d = f"{base}/d"
    lfs.pipe({f"{d}/a": b"1", f"{d}/sub/deep/b": b"2", f"{d}/empty/c": b"3"})
    with pytest.raises(OSError) as err:  # as fsspec's memory filesystem: rmdir of a non-empty one
        lfs.rm(d, recursive=True, maxdepth=1)
    assert err.value.errno == errno.ENOTEMPTY
    assert lfs.cat(f"{d}/sub/deep/b") == b"2"  # below the depth: kept (the old code removed the tree)
    assert not lfs.exists(f"{d}/a")
    lfs.rm(f"{d}/empty", recursive=True, maxdepth=1)  # all of it within the depth
    assert not lfs.exists(f"{d}/empty")
    lfs.rm(d, recursive=True, maxdepth=3)
    assert not lfs.exists(d)


def test_pickle_keeps_config_and_asynchronous(cluster: LocalCluster) -> None:
    cfg = ClientConfig(mgmtd=cluster.mgmtd_address, readahead_chunks=3)
    fs = LoomFileSystem(cluster.mgmtd_address, config=cfg, asynchronous=True, batch_size=7,
                        skip_instance_cache=True)
    back = pickle.loads(pickle.dumps(fs))  # as to a spawned DataLoader worker
    assert back.asynchronous and back.batch_size == 7  # came back blocking, default batches
    assert back.loom is fs.loom  # the client of that config (was the default config's)


def test_dropped_uncommitted_file_leaves_no_temporary(lfs: LoomFileSystem, base: str) -> None:
    f = lfs.open(f"{base}/w", "wb", autocommit=False)
    f.write(b"never committed")
    f.close()  # closed is not committed: commit() may still come
    assert len(_temps(lfs, base)) == 1
    del f  # fsspec's transaction object still holds it...
    with lfs.transaction:  # ...until the next transaction starts afresh and drops it
        gc.collect()
    assert _temps(lfs, base) == []  # was left behind forever
    assert not lfs.exists(f"{base}/w")


def test_a_script_that_dies_in_a_transaction_exits(cluster: LocalCluster, base: str) -> None:
    """Review (session 14): the uncommitted file's __del__ ran at interpreter exit after the
    shared client was closed, and ``fs.loom`` built a new client there: starting its thread
    during finalisation blocked for ever (a crashed training script never exited)."""
    import subprocess
    import sys
    import time

    script = (
        "from loomfs.fsspec import LoomFileSystem\n"
        f"fs = LoomFileSystem({cluster.mgmtd_address!r})\n"
        "fs.start_transaction()\n"
        f"with fs.open({base + '/crash'!r}, 'wb') as f:\n"
        "    f.write(b'x')\n"
        "raise ValueError('training crashed')\n"
    )
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "training crashed" in r.stderr
    assert time.monotonic() - t0 < 60


def test_a_forked_childs_copy_of_a_transaction_file_leaves_it_alone(cluster: LocalCluster, base: str) -> None:
    """Review (session 14): a forked child (a DataLoader worker) freed its copy of the
    parent's pending transaction file and __del__ unlinked the parent's temporary: the
    parent's commit then failed and the data was lost."""
    import os

    lfs = LoomFileSystem(cluster.mgmtd_address, skip_instance_cache=True)
    lfs.start_transaction()
    f = lfs.open(f"{base}/out", "wb")
    f.write(b"important")
    f.close()
    assert len(_temps(lfs, base)) == 1
    pid = os.fork()
    if pid == 0:  # the child: drop its copy of the pending file, then leave
        code = 0
        try:
            f.__del__()
        except BaseException:
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert len(_temps(lfs, base)) == 1  # still there for the parent
    lfs.end_transaction()
    assert lfs.cat(f"{base}/out") == b"important"
