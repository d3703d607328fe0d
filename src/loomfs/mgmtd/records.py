"""The records mgmtd keeps (no I/O): nodes, targets, chains and chain tables.

``ClusterState`` (``mgmtd.state``) holds one dict of each, keyed by id; ``mgmtd.store`` and
``mgmtd.pgstore`` save and load them (``store.encode_rows``/``decode_rows``). Fields marked "not
persisted" are rebuilt from heartbeats after a restart of mgmtd.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from loomfs.wire.types import NodeState, ScrubStats, TargetState


@dataclass(slots=True)
class NodeRecord:
    node_id: int
    kind: int
    host: str
    port: int
    state: int = NodeState.ALIVE
    last_heartbeat_s: float = 0.0  # clock.monotonic() of the last heartbeat (not persisted)
    draining: bool = False
    metrics_port: int = 0
    # suspect node id -> when this node last reported it unreachable (not persisted)
    accusations: dict[int, float] = field(default_factory=dict)
    domain: str = ""  # failure domain (rack...) from its registration; "" = a domain of its own


@dataclass(slots=True)
class TargetRecord:
    target_id: int
    node_id: int
    path: str
    state: int = TargetState.SERVING
    chain_id: int = 0
    used_bytes: int = 0
    capacity_bytes: int = 0
    chunk_count: int = 0
    disk_id: str = ""  # reported by the node (st_dev of the target's file system)
    scrub: ScrubStats | None = None  # reported with each heartbeat (not persisted)
    offline_since_s: float = 0.0  # monotonic time it went OFFLINE (0 = not offline)
    sync_done_version: int = 0  # version of its chain under which its resync was reported done (0 on a move)
    sync_chunks_left: int = 0
    sync_bytes_left: int = 0
    restarted: bool = False  # its process re-registered; consumed by the next reconcile
    fenced_until_s: float = 0.0  # monotonic: reported unreachable, kept out of its chain until then
    # a SERVING target of a live node is leaving its chain: the change waits until the node said
    # it stopped serving it (revoke_acked) or the lease granted before ran out (revoke_deadline_s);
    # revoke_version is the routing version that took it out (dropped once the node has it)
    revoke_deadline_s: float = 0.0
    revoke_acked: bool = False
    revoke_version: int = 0
    fence_count: int = 0  # fences in a row (each doubles the hold); reset after a quiet period
    last_fence_s: float = 0.0
    # its node reported it OFFLINE: a failed fsync took it out of service (storage.engine.diskfail);
    # not usable until the node reports it serving again (a new process that verified it)
    failed: bool = False
    # the last format id its node reported (the identity of its disk, storage.diskident; "" = none
    # seen yet) and whether it came back with another one while in a chain: then it holds none of
    # the chain's data and never serves from its own contents until a resync into the chain
    # finished (mgmtd.diskident); cleared when it serves again or leaves the chain
    format_id: str = ""
    blank: bool = False


@dataclass(slots=True)
class ChainRecord:
    chain_id: int
    table_id: int
    targets: list[int]
    version: int = 1


@dataclass(slots=True)
class TableRecord:
    table_id: int
    replicas: int
    chain_ids: list[int] = field(default_factory=list)
    version: int = 1
    # an EC group's table (CreateChainTableReq.ec): only its single-replica chains are handed an
    # empty spare when their target is lost (mgmtd.ec). A replicated table (False), even with
    # replicas=1, waits for the member that holds its data. Stores from before the flag load
    # as False (store.decode_rows; ``set_table_ec`` marks an old EC table)
    ec: bool = False

