"""fsspec file objects (hunt 15b): an open read file pickles to a DataLoader worker as
fsspec's buffered files do, and a relaxed filesystem's file served from the caches closes."""

from __future__ import annotations

import pickle

import pytest
from test_fsspec import _close_shared_clients, lfs  # noqa: F401

from loomfs.fsspec import LoomFileSystem
from loomfs.testing import LocalCluster


def test_open_read_file_pickles_at_its_position(lfs: LoomFileSystem, base: str) -> None:  # noqa: F811
    lfs.pipe(f"{base}/f", b"hello world")
    with lfs.open(f"{base}/f", "rb") as f:
        f.seek(6)
        g = pickle.loads(pickle.dumps(f))
        try:
            assert g.tell() == 6
            assert g.read() == b"world"
        finally:
            g.close()
    with lfs.open(f"{base}/w", "wb") as w, pytest.raises(TypeError):
        pickle.dumps(w)


def test_relaxed_cached_file_closes(cluster: LocalCluster, lfs: LoomFileSystem,  # noqa: F811
                                    base: str) -> None:
    lfs.pipe(f"{base}/rx", b"0123456789")
    r = LoomFileSystem(cluster.mgmtd_address, consistency="relaxed")
    assert r.cat(f"{base}/rx") == b"0123456789"  # now in the caches: open serves it from memory
    with r.open(f"{base}/rx") as f:
        assert f.read(3) == b"012"
        g = pickle.loads(pickle.dumps(f))
        assert g.read() == b"3456789"
        g.close()
    assert f.closed
