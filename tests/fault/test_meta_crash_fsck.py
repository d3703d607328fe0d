"""kill -9 meta during a rename/mkdir/unlink storm: the namespace stays consistent, fsck clean."""

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
        print(f"[fault] meta kill -9 in a storm: {len(errors)} ops failed while meta was down; fsck: {rep.files} "
              f"files, {rep.chunks} chunk replicas, {len(rep.orphans)} orphan inodes, {len(rep.missing)} missing")
        assert rep.missing == [] and rep.bad_lengths == []
        if rep.orphans:
            fixed = fsck(fs, lambda: c.chunks_of(0), routing, repair=True, grace_s=0.5)
            assert fixed.removed > 0
        again = fsck(fs, lambda: c.chunks_of(0), c.routing())
        assert again.clean, (again.orphans, again.missing)
        for top, _dirs, files in fs.walk("/storm"):  # every file in the namespace is readable
            for name in files:
                fs.cat(f"{top}/{name}")
    finally:
        fs.close()
