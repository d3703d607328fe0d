"""Group commit under a crash: eight threads create small files (one meta write transaction
each, committed in groups), meta is killed with SIGKILL in the middle, and after its restart
every create that was acknowledged is there with its bytes (``sqlite_synchronous = FULL``: an
ack waits for its group's fsynced COMMIT). Creates in flight at the kill may or may not have
happened; nothing acknowledged is lost, and no file holds another's bytes."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Iterator

import pytest

import loomfs
from loomfs.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

THREADS = 8


@pytest.fixture()
def full_sync() -> Iterator[LocalCluster]:
    root = tempfile.mkdtemp(prefix="loomfs-it-gccrash-")
    c = LocalCluster(root, storage_nodes=1, targets_per_node=1, replicas=1,
                     meta_config={"sqlite_synchronous": "FULL"})
    try:
        c.start(timeout_s=60)
        yield c
    finally:
        c.stop()
        shutil.rmtree(root, ignore_errors=True)


def _content(k: int, i: int) -> bytes:
    return f"thread {k} file {i} ".encode() * 20


def test_acked_creates_survive_a_kill_of_meta(full_sync: LocalCluster) -> None:
    c = full_sync
    fs = loomfs.connect(str(c.root))
    try:
        for k in range(THREADS):
            fs.makedirs(f"/gc/t{k}", exist_ok=True)
        acked: list[list[int]] = [[] for _ in range(THREADS)]
        stop = threading.Event()
        failures = [0] * THREADS

        def writer(k: int) -> None:
            i = 0
            while not stop.is_set():
                try:
                    fs.pipe(f"/gc/t{k}/f{i}", _content(k, i))
                except OSError:  # meta down: this one is unknown, the next gets a new name
                    failures[k] += 1
                    time.sleep(0.02)
                else:
                    acked[k].append(i)
                i += 1

        threads = [threading.Thread(target=writer, args=(k,), daemon=True) for k in range(THREADS)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while sum(map(len, acked)) < 300 and time.monotonic() < deadline:
            time.sleep(0.05)
        before_kill = sum(map(len, acked))
        c.kill_service("meta1")  # SIGKILL: groups open or committing die with it
        time.sleep(0.3)
        c.start_service("meta1")
        c.wait_listening("meta1")
        deadline = time.monotonic() + 30
        while sum(map(len, acked)) < before_kill + 100 and time.monotonic() < deadline:
            time.sleep(0.05)  # and creates go on against the restarted meta
        stop.set()
        for t in threads:
            t.join(60)
        total = sum(map(len, acked))
        assert before_kill >= 300 and total >= before_kill + 100, (before_kill, total, failures)
        for k in range(THREADS):
            names = set(fs.listdir(f"/gc/t{k}"))
            missing = [i for i in acked[k] if f"f{i}" not in names]
            assert not missing, f"thread {k}: acknowledged creates lost: {missing[:10]}"
            for i in acked[k]:
                assert fs.cat(f"/gc/t{k}/f{i}") == _content(k, i)
            for name in names:  # whatever else is there (in flight at the kill) is whole
                i = int(name[1:])
                assert fs.cat(f"/gc/t{k}/{name}") == _content(k, i)
        print(f"[gc-crash] {before_kill} creates acked before the kill, {total} in all, {sum(failures)} failed "
              "while meta was down; none lost")
    finally:
        fs.close()
