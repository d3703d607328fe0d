"""Integration fixtures: a real cluster of processes on 127.0.0.1 (1 mgmtd, 1 meta, 3 storage)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

import loomfs
from loomfs.testing import LocalCluster


def _start(name: str, **kw: object) -> LocalCluster:
    root = tempfile.mkdtemp(prefix=f"loomfs-it-{name}-")
    c = LocalCluster(root, **kw)  # type: ignore[arg-type]
    try:
        c.start(timeout_s=60)
    except BaseException:
        c.stop()
        _dump_logs(c)
        raise
    return c


def _dump_logs(c: LocalCluster) -> None:
    for s in c.services.values():
        if os.path.exists(s.log_path):
            with open(s.log_path, errors="replace") as f:
                tail = f.read()[-3000:]
            print(f"----- {s.name} log tail -----\n{tail}")


def _finish(c: LocalCluster, request: pytest.FixtureRequest) -> None:
    c.stop()
    failed = getattr(request.node, "_loomfs_failed", False)
    if failed:
        _dump_logs(c)
    else:
        shutil.rmtree(c.root, ignore_errors=True)


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):  # type: ignore[no-untyped-def]
    outcome = yield
    rep = outcome.get_result()
    if rep.failed:
        item.session._loomfs_failed = True  # type: ignore[attr-defined]
        for node in (item.module, item.session):
            node._loomfs_failed = True


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """One shared cluster for tests that do not restart or kill services."""
    c = _start("shared", gc_delay_s=1.0)
    yield c
    _finish(c, request)


@pytest.fixture(scope="module")
def own_cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """A cluster of this test module's own (for restarts and faults)."""
    c = _start(request.module.__name__.rsplit(".", 1)[-1], gc_delay_s=1.0)
    yield c
    _finish(c, request)


@pytest.fixture()
def fs(cluster: LocalCluster) -> Iterator[loomfs.LoomFS]:
    """A client of the shared cluster."""
    client = loomfs.connect(str(cluster.root))
    yield client
    client.close()


@pytest.fixture()
def base(fs: loomfs.LoomFS, request: pytest.FixtureRequest) -> str:
    """A fresh directory of this test's own in the shared cluster."""
    path = "/t_" + "".join(c if c.isalnum() else "_" for c in request.node.name)[:150]
    if fs.exists(path):
        fs.rmtree(path)
    fs.makedirs(path, exist_ok=True)
    return path


class Calls:
    """Every meta and storage RPC method a client sends (an RpcObserver; the background
    routing refresh to mgmtd is left out)."""

    def __init__(self) -> None:
        self.methods: list[str] = []

    def on_call(self, side: str, method: str, status: int, seconds: float, bytes_in: int, bytes_out: int) -> None:
        if method != "get_routing":
            self.methods.append(method)


@pytest.fixture()
def calls(fs: loomfs.LoomFS) -> Iterator[Calls]:
    """The RPC methods ``fs``'s async core sends during the test."""
    c = Calls()
    rpc = fs.client.rpc
    assert rpc is not None
    rpc.observers.append(c)
    yield c
    rpc.observers.remove(c)
