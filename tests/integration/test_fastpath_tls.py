"""The caller-thread fast path under TLS: it wraps its socket as the async core does and answers
(no fallbacks), so a TLS cluster keeps the one-round-trip stat/cat."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator

import pytest

import loomfs
from loomfs.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def tls_cluster() -> Iterator[LocalCluster]:
    root = tempfile.mkdtemp(prefix="loomfs-it-fptls-")
    c = LocalCluster(root, storage_nodes=1, targets_per_node=1, replicas=1, tls=True)
    try:
        c.start(timeout_s=90)
        yield c
    finally:
        c.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_fast_path_speaks_tls(tls_cluster: LocalCluster) -> None:
    import ssl

    fs = loomfs.connect(str(tls_cluster.root))
    try:
        fs.makedirs("/t", exist_ok=True)
        fs.pipe("/t/f", b"hello")
        fs.stat("/t")  # picks the meta server
        fast = fs._fast
        assert fast is not None
        calls, fell_back = fast.calls, fast.fallbacks
        for _ in range(10):
            assert fs.stat("/t/f").st_size == 5
        assert fs.cat("/t/f") == b"hello"
        assert fast.calls >= calls + 11 and fast.fallbacks == fell_back
        assert isinstance(fast._local.conn.sock, ssl.SSLSocket)
    finally:
        fs.close()
