"""Restart every service (one at a time, then all) and read everything back."""

from __future__ import annotations

import hashlib
import os

import pytest

import loomfs
from loomfs.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def _write_set(fs: loomfs.LoomFS, base: str) -> dict[str, str]:
    fs.makedirs(f"{base}/a/b", exist_ok=True)
    want = {}
    for i, size in enumerate([0, 1, 4095, 1 << 20, (9 << 20) + 7]):
        p = f"{base}/a/b/f{i}" if i % 2 else f"{base}/f{i}"
        data = os.urandom(size)
        with fs.open(p, "wb") as f:
            f.write(data)
        want[p] = hashlib.sha256(data).hexdigest()
    fs.symlink(f"{base}/f0", f"{base}/link")
    return want


def _check(fs: loomfs.LoomFS, want: dict[str, str]) -> None:
    for p, digest in want.items():
        assert hashlib.sha256(fs.cat(p)).hexdigest() == digest, p


def test_restart_each_service_then_all(own_cluster: LocalCluster) -> None:
    fs = loomfs.connect(str(own_cluster.root))
    want = _write_set(fs, "/r1")
    names = ["meta1", "mgmtd"] + [n for n in own_cluster.services if n.startswith("storage")]
    for name in names:
        own_cluster.restart_service(name)
        _check(fs, want)  # the same client keeps working across the restart
        extra = f"/r1/after-{name}"
        with fs.open(extra, "wb") as f:
            f.write(name.encode() * 1000)
        want[extra] = hashlib.sha256(name.encode() * 1000).hexdigest()
    fs.close()
    own_cluster.stop()
    own_cluster.start()
    fs = loomfs.connect(str(own_cluster.root))
    _check(fs, want)
    assert fs.readlink("/r1/link") == "/r1/f0"
    assert sorted(n.rsplit("/", 1)[-1] for n in fs.ls("/r1/a/b")) == ["f1", "f3"]
    fs.close()
