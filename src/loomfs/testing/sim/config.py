"""What one simulated run looks like: cluster shape, timings, workload and fault rates."""

from __future__ import annotations

from dataclasses import dataclass, replace

FAULT_KINDS = ("crash", "pause", "partition", "link", "disk", "flip", "mgmtd", "fsync", "wipe")
FAULT_WEIGHTS = (3, 2, 3, 3, 2, 1, 1, 2, 2)
# the kinds the "ci" and "soak" profiles draw from: "fsync" (a failed fsync takes a target out
# of service until its process restarts, storage.engine.diskfail) came later and has its own
# profile, so the seeds in tests/sim keep the fault schedules they were measured with (a kind
# left out has weight 0, which leaves every other draw unchanged)
CLASSIC_KINDS = FAULT_KINDS[:7]
# the kinds of the "fsync" and "blocks" profiles ("wipe", a replaced disk, came later still and
# is drawn by the "replace" profile only)
FSYNC_KINDS = FAULT_KINDS[:8]


@dataclass(frozen=True, slots=True, kw_only=True)
class SimConfig:
    # cluster
    storage_nodes: int = 4
    targets_per_node: int = 2  # 4 nodes x 2 targets, R=3: 2 chains + 2 spares
    replicas: int = 3
    clients: int = 3
    heartbeat_interval_s: float = 0.25
    lease_s: float = 1.25
    replace_after_s: float = 0.0  # 0: offline targets are never replaced by spares
    suspect_after_s: float = 1.0
    rpc_connect_timeout_s: float = 0.5
    rpc_call_timeout_s: float = 2.0  # storage forwards and mgmtd calls
    scrub_interval_s: float = 1.0
    scrub_bytes_per_s: int = 8 << 20
    # workload
    chunks: int = 3
    chunk_size_bytes: int = 16 << 10
    write_bytes_max: int = 2048
    think_s_max: float = 0.06
    client_op_timeout_s: float = 4.0
    # phases (virtual seconds)
    duration_s: float = 8.0  # clients work and faults happen
    converge_s: float = 30.0  # after faults stop, chains must converge within this
    # faults
    faults: bool = True
    fault_kinds: tuple[str, ...] = CLASSIC_KINDS  # a subset turns the others off
    fault_gap_s_mean: float = 0.6
    fault_len_s_max: float = 3.0
    restart_delay_s_max: float = 2.5
    disk_fault_s_max: float = 1.0  # every write through the sick disk fails meanwhile
    # removals: a deleted file's chunks written, then removed (REMOVE_CHUNKS, as meta's GC does)
    # while late writers of that file still write (0: none, the classic workload)
    removals: bool = False
    # how often a late writer of such a file writes one of its chunks while it is removed. Off in
    # every profile: a late copy of a forwarded removal (a retried RPC) can still remove the chunk
    # such a writer re-created on one replica only, an orphan of a deleted file on some replicas
    # (known, docs/fault-tolerance.md; fsck removes it)
    late_writes: float = 0.0
    wall_limit_s: float = 120.0  # a run using more real time than this fails

    def with_(self, **changes: object) -> SimConfig:
        return replace(self, **changes)  # type: ignore[arg-type]


CI = SimConfig()
SOAK = SimConfig(duration_s=20.0, clients=4)
FSYNC = SimConfig(fault_kinds=FSYNC_KINDS)  # ci plus failed fsyncs
# ci plus failed fsyncs, with chunks of 2.5 CRC blocks (BLOCK_BYTES is 64 KiB) and writes up to
# 16 KiB: overwrites that keep whole blocks, appends that carry earlier blocks unread, bit rot
# in a block other than the last, and the scrubber's block-level repair (storage/blockrepair.py)
BLOCKS = FSYNC.with_(chunk_size_bytes=160 << 10, write_bytes_max=16 << 10)
# fsync plus replaced disks (a target back empty under its id), offline targets replaced by
# spares after a second, and deleted files' chunks removed while late writers still write them
# (replication hunt, session 15)
REPLACE = SimConfig(fault_kinds=FAULT_KINDS, replace_after_s=1.0, removals=True)
