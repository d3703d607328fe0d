"""Types shared by several services: routing, layouts, chunk ids, attributes."""

from __future__ import annotations

from enum import IntEnum

from loomfs.wire.message import Message, many, message

SERVICE_MGMTD = 1
SERVICE_META = 2
SERVICE_STORAGE = 3

ROOT_INODE = 1
# the largest file length (1 PiB; ext4 allows 16 TiB, CephFS 1 TiB by default): EFBIG past it,
# so meta's byte counters (sums of lengths, int64 in both stores) never overflow
FILE_BYTES_MAX = 1 << 50


class NodeKind(IntEnum):
    MGMTD = 1
    META = 2
    STORAGE = 3


class NodeState(IntEnum):
    ALIVE = 1
    DEAD = 2  # missed heartbeats past its lease


class TargetState(IntEnum):
    """Public target states (3FS names). Issue 3 drives the full transition table."""

    SERVING = 1
    SYNCING = 2
    WAITING = 3
    LASTSRV = 4
    OFFLINE = 5


class FileType(IntEnum):
    FILE = 1
    DIRECTORY = 2
    SYMLINK = 3
    # special files (mknod through the mount): no data; a device's number is ``Attr.rdev``
    FIFO = 4
    SOCKET = 5
    CHAR_DEVICE = 6
    BLOCK_DEVICE = 7


@message
class NodeInfo(Message):
    node_id: int = 0
    kind: int = 0  # NodeKind
    host: str = ""
    port: int = 0
    state: int = NodeState.ALIVE
    last_heartbeat_ms: int = 0
    draining: bool = False  # `admin drain`: its replicas are moving to spares
    metrics_port: int = 0  # its Prometheus /metrics HTTP port (0 = none)
    domain: str = ""  # storage: its failure domain (rack/room label; "" = a domain of its own)


@message
class ScrubStats(Message):
    """What a target's scrubber did (shown by ``loomfs admin targets``)."""

    interval_s: float = 0.0  # between passes (0: scrubbing is off)
    passes: int = 0  # full passes finished since the node started
    checked: int = 0  # chunks of this target checked
    bad: int = 0  # chunks of this target found rotten (by passes, reads or clients' reports)
    repaired: int = 0
    # wall-clock times (unix seconds, rounded to 1 s; 0: none), so a report changes only when
    # the scrubber does something and mgmtd's routing cache keeps between passes
    last_pass_end_unix_s: float = 0.0  # when the last pass ended
    next_pass_unix_s: float = 0.0  # when the next pass starts (0: running now, or scrubbing off)
    rebuilt: int = 0  # of ``repaired``: rebuilt block by block from other versions (storage/blockrepair.py)


@message
class TargetInfo(Message):
    target_id: int = 0
    node_id: int = 0
    path: str = ""
    state: int = TargetState.SERVING
    chain_id: int = 0  # 0 = not in a chain (spare)
    used_bytes: int = 0
    capacity_bytes: int = 0
    chunk_count: int = 0
    # resync progress (filled by mgmtd from the predecessor's reports while SYNCING)
    sync_chunks_left: int = 0
    sync_bytes_left: int = 0
    draining: bool = False  # its node is being drained
    disk_id: str = ""  # the file system the target lives on (st_dev): capacity counts each disk once
    scrub: ScrubStats | None = None  # the node's scrubber, for this target
    # storage -> mgmtd: this process read every committed chunk of the target back from its disk
    # after a failed fsync (storage.engine.diskfail). mgmtd lets a target it saw fail serve again
    # only once its node says so (the FSYNC_FAILED marker that makes a new process verify is best
    # effort: the failing disk may refuse it too). Absent (an older node): not verified.
    verified: bool = False
    # mgmtd -> everyone (routing; a storage node's report leaves them unset, mgmtd ignores them):
    # the target came back with another disk (a new format id, mgmtd.diskident) and holds none of
    # its chain's data until a resync into the chain finished; it never serves from its contents
    # (a blank LASTSRV marks a chain whose newest copy is lost). format_id: the disk's id mgmtd
    # recorded ("": none). Absent (an older mgmtd): False / "".
    blank: bool = False
    format_id: str = ""


@message
class ChainInfo(Message):
    chain_id: int = 0
    version: int = 1  # bumped on every reconfiguration
    targets: list[int] = many()  # ordered head..tail; serving targets only are routable
    table_id: int = 0


@message
class ChainTable(Message):
    table_id: int = 0
    version: int = 1
    replicas: int = 3
    chain_ids: list[int] = many()
    # an EC group's table (mgmtd's TableRecord.ec: CreateChainTableReq.ec, admin table set-ec):
    # its single-replica chains hold EC fragments; a lost target gets an empty spare that meta's
    # EC rebuild fills. A replicated table, one replica included, is False. Absent (an older
    # mgmtd): False, so nothing is taken for EC by its replica count (docs/ec.md)
    ec: bool = False


@message
class RoutingInfo(Message):
    version: int = 0
    nodes: list[NodeInfo] = many()
    targets: list[TargetInfo] = many()
    chains: list[ChainInfo] = many()
    tables: list[ChainTable] = many()


@message
class Layout(Message):
    """How a file's bytes map onto chains. Chunk i lives on chains[i % stripe]."""

    chunk_size: int = 4 << 20
    stripe: int = 16  # requested width; a file's actual width is len(chains)
    table_id: int = 1
    replicas: int = 0  # 0 = whatever table_id has; else pick a table with that many replicas
    chains: list[int] = many()  # filled in for files; empty on directories
    # files up to this many bytes keep their data in meta (inline). Directories: -1 = the
    # meta server's default, 0 = never; files: the limit fixed when they were created
    inline_max_bytes: int = -1
    # erasure coding (loomfs.ec, docs/ec.md): ec_k > 0 makes this ``ec(k, m, chunk_size)``; a
    # file's chains are its k+m single-replica chains on distinct nodes (fragments: loomfs.ec.stripe)
    ec_k: int = 0
    ec_m: int = 0
    # every replica fsyncs each commit of this file's chunks before it acks (checkpoints:
    # docs/checkpoints.md), whatever the storage nodes' fsync_on_commit
    durable: bool = False
    # EC files: > 0 while a stripe may have been written without some of its fragments
    # (``ec_ack_fragments_min``) since the last scrub that repaired the whole file; a skipped
    # fragment's server may come back with the old bytes, so reads compare versions (a
    # generation: each reduced write bumps it, a scrub clears the one it started with)
    ec_reduced: int = 0


@message
class Attr(Message):
    inode: int = 0
    type: int = FileType.FILE
    mode: int = 0o644  # permission bits only
    nlink: int = 1
    uid: int = 0
    gid: int = 0
    size: int = 0
    atime_ns: int = 0
    mtime_ns: int = 0
    ctime_ns: int = 0
    layout: Layout | None = None  # files: their layout; directories: the layout children inherit
    symlink_target: str = ""
    inline: bool = False  # files: the bytes live in meta (``loomfs.meta.ops.inline``), not in chunks
    rdev: int = 0  # device nodes (CHAR_DEVICE, BLOCK_DEVICE): the device number (st_rdev)


@message
class DirEntry(Message):
    name: str = ""
    inode: int = 0
    type: int = FileType.FILE
    attr: Attr | None = None  # filled when with_attrs was asked
