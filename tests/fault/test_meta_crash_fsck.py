"""kill -9 meta during a create/write/rename/unlink storm: the namespace stays consistent and
fsck finds it clean without repair; fsck --repair removes orphans planted on storage."""

from __future__ import annotations

import random
import threading
import time

import pytest
from faultkit import start_cluster

import loomfs
from loomfs.cli.fsck import fsck
from loomfs.testing import LocalCluster

pytestmark = [pytest.mark.integration]


def _storm(fs: loomfs.LoomFS, rng: random.Random, stop: threading.Event, errors: list[str]) -> None:
    i = 0
    while not stop.is_set():
        i += 1
        try:
            d = f"/storm/d{rng.randrange(8)}"
            fs.makedirs(d, exist_ok=True)
            p = f"{d}/f{i}"
            with fs.open(p, "wb") as f:
                f.write(rng.randbytes(rng.randrange(1, 200_000)))
            op = rng.random()
            if op < 0.4:
                fs.rename(p, f"/storm/d{rng.randrange(8)}/r{i}")
            elif op < 0.7:
                fs.unlink(p)
        except OSError as exc:  # meta is down for a moment: expected, retried by the next op
            errors.append(f"{type(exc).__name__}: {exc}")
            time.sleep(0.05)


@pytest.mark.timeout(180)
def test_kill9_meta_during_namespace_storm_then_fsck(make_cluster: list[LocalCluster], seed: int) -> None:
    c = start_cluster("metacrash")
    make_cluster.append(c)
    rng = random.Random(seed)
    fs = loomfs.connect(str(c.root))
    try:
        fs.makedirs("/storm", exist_ok=True)
        fs.set_layout("/storm", chunk_size=64 << 10, stripe=2)
        stop, errors = threading.Event(), []  # type: ignore[var-annotated]
        th = threading.Thread(target=_storm, args=(fs, rng, stop, errors), daemon=True)
        th.start()
        time.sleep(2.0)
        c.kill_service("meta1")
        time.sleep(0.5)
        c.start_service("meta1")
        c.wait_listening("meta1")
        time.sleep(2.0)
        stop.set()
        th.join(60)
        time.sleep(3.0)  # gc_delay_s = 1: unlinked files' chunks are collected
        routing = c.routing()
        rep = fsck(fs, lambda: c.chunks_of(0), routing)
        gc_pending = fs.statfs().gc_pending
        print(f"[fault] meta kill -9 in a storm: {len(errors)} ops failed while meta was down; fsck: {rep.files} "
              f"files, {rep.chunks} chunk replicas, {len(rep.orphans)} orphan inodes, {len(rep.missing)} missing, "
              f"{gc_pending} GC entries pending")
        # the system cleans up after itself: no orphan (the restarted meta's GC removals are
        # applied, not taken for retries of the killed one's; a re-sent OPEN leaves no second
        # write session to hold an unlinked file), nothing stuck in the GC queue, no repair
        assert rep.clean, (sorted(rep.orphans), rep.missing, rep.bad_lengths, errors)
        assert gc_pending == 0
        for top, _dirs, files in fs.walk("/storm"):  # every file in the namespace is readable
            for name in files:
                fs.cat(f"{top}/{name}")
    finally:
        fs.close()


@pytest.mark.timeout(120)
def test_fsck_repair_removes_planted_orphans_only(make_cluster: list[LocalCluster], seed: int) -> None:
    """Chunks of an inode the namespace does not know (planted straight on storage) are
    reported, and ``repair`` removes them through their chains; live files are untouched."""
    c = start_cluster("fsckrepair")
    make_cluster.append(c)
    rng = random.Random(seed)
    fs = loomfs.connect(str(c.root))
    try:
        fs.makedirs("/live", exist_ok=True)
        fs.set_layout("/live", chunk_size=64 << 10, stripe=2)
        content = {f"/live/f{i}": rng.randbytes(rng.randrange(1, 300_000)) for i in range(6)}
        for path, data in content.items():
            fs.pipe(path, data)
        layout = fs.attr("/live/f0").layout
        assert layout is not None
        orphan = (1 << 40) + rng.randrange(1 << 20)  # far above any inode meta hands out
        for index in range(3):
            data = rng.randbytes(1000)
            fs.run(fs.client.storage.write_chunk(layout, orphan, index, 0, memoryview(data)))
        routing = c.routing()
        rep = fsck(fs, lambda: c.chunks_of(0), routing)
        assert set(rep.orphans) == {orphan} and not rep.missing and not rep.bad_lengths
        assert {index for _chain, index in rep.orphans[orphan]} == {0, 1, 2}
        fixed = fsck(fs, lambda: c.chunks_of(0), routing, repair=True, grace_s=0.2)
        assert fixed.removed == len(rep.orphans[orphan])  # one per (chain, chunk)
        again = fsck(fs, lambda: c.chunks_of(0), c.routing())
        assert again.clean and again.files == len(content), (again.orphans, again.missing)
        assert all(fs.cat(path) == data for path, data in content.items())
        print(f"[fault] fsck repair: planted 3 orphan chunks of inode {orphan:#x}, removed {fixed.removed}; "
              f"{again.files} live files intact")
    finally:
        fs.close()
