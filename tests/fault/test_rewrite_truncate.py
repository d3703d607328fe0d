"""Files that keep changing (overlapping rewrites in place, appends, truncates that shrink and
extend) across storage faults: kill -9 and restart, SIGSTOP past the lease, a cut between a
chain's head and its successor. Concurrent readers see only states the file really had (chunk
by chunk); afterwards each file equals its model exactly, every replica of every chunk holds
the model's bytes (same version, length and CRC), and fsck is clean."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from faultkit import LEASE_S, RewriteWorkload, log_lines, replica_problems, start_cluster
from test_network_cut import _adjacent, _write_paths

import loomfs
from loomfs.cli.fsck import fsck
from loomfs.testing import LocalCluster
from loomfs.wire.types import RoutingInfo, TargetState

pytestmark = [pytest.mark.integration]

CHUNK_BYTES = 64 << 10  # the smallest chunk size: every op is near a chunk boundary
FILES = 3
MAX_CHUNKS = 3


def _offline(node_id: int) -> Callable[[RoutingInfo], bool]:
    def ok(r: RoutingInfo) -> bool:
        return all(t.state == TargetState.OFFLINE for t in r.targets if t.node_id == node_id)
    return ok


# A shrink across a chunk boundary trims whole chunks. That used to remove them, so a chunk
# written again started over at version 1 and one (chunk, version) named different bytes
# over time; a replica that missed the removal kept the dead chunk at a higher version
# (acked-but-unapplied writes, stale reads, divergent replicas at 57c0f94; VERSION_MISMATCH
# errors with the never-go-backwards fences). Trims now make each chunk an empty new version.


@pytest.mark.timeout(180)
def test_rewrite_truncate_through_faults(make_cluster: list[LocalCluster], seed: int) -> None:
    # a target fenced for the cut stays out 1 s (not 2 leases, doubled on a second fence): the
    # cut phase is not about the hold, and the test has a CI budget
    c = start_cluster("rewrite", fault_injection=True, storage_config={"suspect_after_s": 1.0},
                      mgmtd_config={"unreachable_hold_s": 1.0})
    make_cluster.append(c)
    fs = loomfs.connect(str(c.root))
    t_start = time.monotonic()
    phases: list[str] = []
    try:
        fs.makedirs("/rw", exist_ok=True)
        fs.set_layout("/rw", chunk_size=CHUNK_BYTES, stripe=MAX_CHUNKS)
        w = RewriteWorkload(fs, [f"/rw/f{i}" for i in range(FILES)], CHUNK_BYTES, seed,
                            max_chunks=MAX_CHUNKS, remove_chunks=True).create().start()
        w.wait_progress(10, 30, "warming up")

        # 1. kill -9 a storage node; the files keep changing on two replicas; restart: resync
        w.phase = "kill -9 storage3"
        t0 = time.monotonic()
        c.kill_service("storage3")
        c.wait_routing(_offline(3), 10 * LEASE_S, "storage3 offline")
        t_detect = time.monotonic() - t0
        w.wait_progress(5, 30, "storage3 is down")
        w.phase = "storage3 restarted"
        t1 = time.monotonic()
        c.start_service("storage3")
        c.wait_routing(c.fully_replicated, 60, "storage3 resynced")
        phases.append(f"kill -9: offline {t_detect:.2f}s, resynced {time.monotonic() - t1:.2f}s after restart")

        # 2. SIGSTOP a storage node past its lease, SIGCONT: it rejoins and resyncs
        w.phase = "SIGSTOP storage1"
        t0 = time.monotonic()
        c.pause_service("storage1")
        c.wait_routing(_offline(1), 10 * LEASE_S, "storage1 (stopped) offline")
        t_detect = time.monotonic() - t0
        w.wait_progress(5, 30, "storage1 is stopped")
        w.phase = "SIGCONT storage1"
        t1 = time.monotonic()
        c.resume_service("storage1")
        c.wait_routing(c.fully_replicated, 60, "storage1 resynced after SIGCONT")
        phases.append(f"SIGSTOP: offline {t_detect:.2f}s, resynced {time.monotonic() - t1:.2f}s after SIGCONT")

        # 3. cut the network between the head of f0's first chain and its successor
        layout = fs.attr("/rw/f0").layout
        assert layout is not None
        r = c.routing()
        chain_ids = [ch.chain_id for ch in r.chains]
        path = _write_paths(r)[chain_ids.index(layout.chains[0])]
        a, b = path[0], path[1]
        name = {s.node_id: s.name for s in c.services.values() if s.kind == "storage"}
        w.phase = f"cut storage{a}<->storage{b}"
        t0 = time.monotonic()
        c.cut(name[a], name[b])
        c.wait_routing(lambda r: not _adjacent(r, a, b), 30, f"chains routing around the cut {a}-{b}")
        t_route = time.monotonic() - t0
        w.wait_progress(5, 30, f"storage{a} and storage{b} are cut apart")
        w.phase = "healed"
        t1 = time.monotonic()
        c.heal()
        c.wait_routing(c.fully_replicated, 60, "full redundancy after the cut healed")
        phases.append(f"cut storage{a}<->storage{b}: routed around {t_route:.2f}s, full redundancy "
                      f"{time.monotonic() - t1:.2f}s after healing")

        w.phase = "after the faults"
        w.wait_progress(3, 30, "after the faults")
        stats = w.stop()
        c.wait_routing(c.fully_replicated, 60, "full redundancy at the end")
        print(f"[fault] rewrite/truncate: {'; '.join(phases)}; ops {stats.ops}, {stats.reads} whole-file reads "
              f"checked ({stats.reads_unchecked} too old to check), longest op {stats.max_op_s:.2f}s, "
              f"{len(stats.errors)} errors, {len(stats.mismatches)} impossible reads")
        bad_files = w.verify_files()
        # background work (leftover pending versions, resync tails) settles: poll, then judge
        deadline = time.monotonic() + 20
        while True:
            problems = [p for m in w.models.values() for p in replica_problems(c, fs, m)]
            if not problems or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        for line in stats.errors[:10] + stats.mismatches[:10] + bad_files + problems[:20]:
            print(f"[fault] rewrite/truncate problem: {line}")
        if stats.errors or stats.mismatches or bad_files or problems:
            print(f"[fault] rewrite/truncate: operation logs in {w.dump_oplogs(str(c.root))}; service logs:")
            for line in log_lines(c, r"VERSION_MISMATCH|differs|replacing|older than|resync .* (failed|copied)"):
                print(f"    {line}")
        assert stats.errors == [], stats.errors[:5]
        assert stats.mismatches == [], stats.mismatches[:5]
        assert bad_files == []
        assert problems == [], problems[:10]
        rep = fsck(fs, lambda: c.chunks_of(0), c.routing())
        assert rep.clean, (rep.orphans, rep.missing, rep.bad_lengths)
        print(f"[fault] rewrite/truncate: {FILES} files verified on every replica; fsck clean; "
              f"{time.monotonic() - t_start:.1f}s after start-up")
    finally:
        fs.close()
