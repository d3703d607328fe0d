"""``loomfs admin fsck`` right after an unlink storm (issue 15 item 9): chunks waiting in the
GC queue are counted apart, not reported as orphans; a real orphan still is; the check runs
by mgmtd address (no local cluster directory)."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator

import pytest

import loomfs
from loomfs.cli.fsck import fsck
from loomfs.cli.main import main
from loomfs.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def slow_gc_cluster() -> Iterator[LocalCluster]:
    c = LocalCluster(tempfile.mkdtemp(prefix="loomfs-it-fsckgc-"), gc_delay_s=600.0)
    try:
        c.start(timeout_s=60)
        yield c
    finally:
        c.stop()
        shutil.rmtree(c.root, ignore_errors=True)


def test_gc_queue_is_not_orphans_and_fsck_works_by_address(slow_gc_cluster: LocalCluster,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    c = slow_gc_cluster
    fs = loomfs.connect(str(c.root))
    try:
        fs.makedirs("/storm", exist_ok=True)
        fs.set_layout("/storm", chunk_size=64 << 10, stripe=2)
        for i in range(12):
            fs.pipe(f"/storm/f{i}", bytes([i]) * 200_000)  # chunked (past the inline limit)
        fs.pipe("/storm/keep", b"k" * 200_000)
        layout = fs.attr("/storm/keep").layout
        assert layout is not None
        unlinked = {fs.attr(f"/storm/f{i}").inode for i in range(12)}
        for i in range(12):
            fs.unlink(f"/storm/f{i}")
        assert fs.statfs().gc_pending == 12  # gc_delay_s = 600: all still queued
        orphan = (1 << 40) + 12345  # far above any inode meta hands out
        fs.run(fs.client.storage.write_chunk(layout, orphan, 0, 0, memoryview(b"x" * 1000)))

        rep = fsck(fs, None, c.routing())
        assert set(rep.gc_queued) == unlinked
        assert set(rep.orphans) == {orphan}, sorted(rep.orphans)
        assert not rep.missing and not rep.unreachable and rep.files >= 1

        mgmtd = json.loads((c.root / "cluster.json").read_text())["mgmtd"]
        capsys.readouterr()
        rc = main(["admin", "fsck", "--mgmtd", mgmtd])
        out = capsys.readouterr().out
        assert rc == 1  # the planted orphan
        assert "1 orphan chunks of 1 inodes" in out and "of 12 unlinked files wait in the GC queue" in out
        assert main(["admin", "fsck", "--mgmtd", mgmtd, "--repair", "--grace-s", "0.1"]) == 0
        assert "removed 1 orphan chunks" in capsys.readouterr().out
        again = fsck(fs, None, c.routing())
        assert not again.orphans and set(again.gc_queued) == unlinked
        assert fs.cat("/storm/keep") == b"k" * 200_000
    finally:
        fs.close()


def test_a_file_held_open_after_its_unlink_is_no_orphan(slow_gc_cluster: LocalCluster) -> None:
    """Meta keeps a file whose last name went while a client holds it (loomfs.meta.orphans):
    fsck counts its chunks apart (meta holds the inode), --repair leaves them; after the
    holder's close it waits in the GC queue like any unlinked file."""
    c = slow_gc_cluster
    fs = loomfs.connect(str(c.root))
    try:
        fs.makedirs("/held", exist_ok=True)
        fs.set_layout("/held", chunk_size=64 << 10, stripe=2)
        f = fs.open("/held/f", "xb")
        f.write(b"h" * 200_000)
        f.flush()
        ino = fs.attr("/held/f").inode
        fs.unlink("/held/f")
        rep = fsck(fs, None, c.routing(), repair=True, grace_s=0.1)
        assert ino not in rep.orphans and ino not in rep.gc_queued and ino in rep.held_elsewhere
        assert rep.removed == 0
        f.write(b"more")  # the holder goes on writing: its chunks are still there
        f.close()
        rep = fsck(fs, None, c.routing())
        assert ino in rep.gc_queued and ino not in rep.orphans and ino not in rep.held_elsewhere
    finally:
        fs.close()
