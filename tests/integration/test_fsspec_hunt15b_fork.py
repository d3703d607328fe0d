"""A file opened through fsspec in a parent, read in a forked child (hunt 15b): a DataLoader
worker started by fork gets the parent's objects as they are (a pyarrow ``ParquetFile``
holding ``fs.open(...)``, say), so a file open for reading must work there: it opens the
path again at the same position; the parent's file keeps working."""

from __future__ import annotations

import multiprocessing
import os

import pytest
from test_fsspec import _close_shared_clients, lfs  # noqa: F401

from loomfs.fsspec import LoomBufferedFile, LoomFileSystem

DATA = bytes(range(256)) * 8192  # 2 MiB: several chunks, not an inline file


def _child_reads(f: LoomBufferedFile, out_path: str) -> None:
    first = f.read(3)  # from the position the parent left
    f.seek(-4, os.SEEK_END)
    last = f.read()
    with open(out_path, "wb") as out:
        out.write(first + last)
    f.close()


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork here")
def test_forked_child_reads_the_parents_open_file(lfs: LoomFileSystem, base: str,  # noqa: F811
                                                  tmp_path: os.PathLike[str]) -> None:
    lfs.pipe_file(f"{base}/f", DATA)
    out = os.path.join(tmp_path, "out")
    with lfs.open(f"{base}/f", "rb") as f:
        assert f.read(10) == DATA[:10]
        child = multiprocessing.get_context("fork").Process(target=_child_reads, args=(f, out))
        child.start()
        child.join(60)
        assert child.exitcode == 0
        with open(out, "rb") as got:
            assert got.read() == DATA[10:13] + DATA[-4:]
        assert f.tell() == 10  # the parent's file: untouched by the child
        assert f.read(5) == DATA[10:15]
