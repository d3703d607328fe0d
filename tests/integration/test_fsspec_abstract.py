"""fsspec's own conformance suite (``fsspec.tests.abstract``: copy, get, put, open, pipe)
run against ``loom://`` on a real cluster."""

from __future__ import annotations

import itertools
import posixpath
from collections.abc import Iterator

import fsspec.tests.abstract as abstract
import pytest

from loomfs.fsspec import LoomFileSystem, close_clients
from loomfs.testing import LocalCluster

_ids = itertools.count()


@pytest.fixture(scope="module", autouse=True)
def _close_shared_clients() -> Iterator[None]:
    """The fsspec layer's shared clients end with this module, before the cluster does."""
    yield
    close_clients()


class LoomFixtures(abstract.AbstractFixtures):  # type: ignore[misc]
    @pytest.fixture(scope="class")
    @classmethod
    def fs(cls, cluster: LocalCluster) -> LoomFileSystem:  # type: ignore[override]
        return LoomFileSystem(cluster.mgmtd_address)

    @pytest.fixture
    def fs_join(self):  # type: ignore[no-untyped-def]
        return posixpath.join

    @pytest.fixture
    def fs_path(self, fs: LoomFileSystem) -> Iterator[str]:
        path = f"/fsspec-abstract/{next(_ids)}"
        fs.makedirs(path, exist_ok=True)
        yield path
        fs.rm(path, recursive=True)


class TestLoomCopy(abstract.AbstractCopyTests, LoomFixtures):  # type: ignore[misc]
    pass


class TestLoomGet(abstract.AbstractGetTests, LoomFixtures):  # type: ignore[misc]
    pass


class TestLoomPut(abstract.AbstractPutTests, LoomFixtures):  # type: ignore[misc]
    pass


class TestLoomOpen(abstract.AbstractOpenTests, LoomFixtures):  # type: ignore[misc]
    pass


class TestLoomPipe(abstract.AbstractPipeTests, LoomFixtures):  # type: ignore[misc]
    pass
