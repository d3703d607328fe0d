"""storage service (id 3): chunk I/O with chain replication (CRAQ).

A chunk is addressed by (inode, index) and lives on one chain. Client writes go to the
chain head; each replica checks ``chain_version``, stores the update as a pending version,
forwards it to its successor (``forwarded=True`` with the head's ``update_ver``); the tail
commits and the commit flows back; the client's ack means the tail committed. The write's
data travels as the frame payload (CRC32C-checked by the framing layer and again against
``data_crc``, which the client computed over its buffer).
"""

from __future__ import annotations

from loomfs.common.identity import Right
from loomfs.wire.message import Empty, Message, many, message, method
from loomfs.wire.types import SERVICE_STORAGE


@message
class ChunkId(Message):
    inode: int = 0
    index: int = 0


@message
class RequestTag(Message):
    """Identifies one client write so a retried copy is applied once."""

    client_id: int = 0
    request_id: int = 0


@message
class WriteReq(Message):
    chain_id: int = 0
    chain_version: int = 0
    chunk: ChunkId | None = None
    offset: int = 0  # inside the chunk
    length: int = 0  # == payload length
    chunk_size: int = 0  # the file's chunk size (upper bound for offset + length)
    data_crc: int = 0  # CRC32C of the payload as the client saw it
    tag: RequestTag | None = None
    # set on hops after the head:
    forwarded: bool = False
    update_ver: int = 0
    full_replace: bool = False  # resync: payload is the whole chunk at version update_ver
    sync: bool = False  # resync copy: replaces whatever the syncing target holds for the chunk
    # the chunk as the sender staged it (forwarded updates): a successor whose result differs
    # (a diverged base, a "duplicate" with other bytes) refuses with VERSION_MISMATCH
    expect_length: int = -1  # -1 = not given
    expect_crc: int = 0
    # whole-chunk replaces and resync copies: the version's request tags, flattened
    # (client_id, request_id, version) triples; the sender of a resync copy (fencing)
    tags: list[int] = many()
    from_target: int = 0
    # resync copy older than what the syncing target committed: the serving chain lost those
    # versions (a crash of every replica that had them unsynced); the copy replaces them
    rollback: bool = False
    # the file's layout is ``durable`` (checkpoints): every replica fsyncs the commit (data,
    # directory entry, index) before it acks, whatever its fsync_on_commit
    durable: bool = False
    # the client's write grant for chunk.inode, from meta's open reply (loomfs.common.grants)
    grant: bytes = b""
    # a fenced write (an EC fragment repair): the head applies it only if the chunk's newest
    # version is at most this one, else VERSION_MISMATCH (-1: any); as TruncateReq.if_ver_le
    if_ver_le: int = -1


@message
class WriteRsp(Message):
    commit_ver: int = 0
    chunk_length: int = 0
    chunk_crc: int = 0


@message
class ReadReq(Message):
    chain_id: int = 0
    chain_version: int = 0
    chunk: ChunkId | None = None
    offset: int = 0
    length: int = 0  # bytes wanted; the reply may be shorter (end of chunk)
    target_id: int = 0  # which replica the client chose (0 = any on that node)
    # repair reads: exactly this version of the chunk, committed or pending, whatever the
    # replica's state or lease (the reader checks it against the length and CRC it recorded
    # for that version; a version names one content); ``length`` 0 reads the whole version,
    # else that range of it (a block rebuild, storage/blockrepair.py)
    exact_ver: int = 0
    # meta's read grant for chunk.inode (loomfs.common.grants: READ_GRANTS, or an open/READ reply);
    # storage checks it for clients (storage/grantcheck.py ReadGrantCheck); services send none
    grant: bytes = b""


@message
class ReadRsp(Message):
    commit_ver: int = 0
    length: int = 0  # bytes in the payload
    chunk_length: int = 0
    exists: bool = True


@message
class TruncateReq(Message):
    chain_id: int = 0
    chain_version: int = 0
    chunk: ChunkId | None = None
    length: int = 0  # new chunk length (may be 0); chunks are removed with RemoveChunks
    chunk_size: int = 0
    tag: RequestTag | None = None
    forwarded: bool = False
    durable: bool = False  # as in WriteReq
    if_ver_le: int = -1  # a fenced trim: only if the chunk's newest version is at most this (-1: any)
    update_ver: int = 0
    expect_length: int = -1  # as WriteReq
    expect_crc: int = 0
    grant: bytes = b""  # as WriteReq


@message
class RemoveChunksReq(Message):
    """Remove chunks [index_begin, index_end) of an inode on one chain (GC, truncate)."""

    chain_id: int = 0
    chain_version: int = 0
    inode: int = 0
    index_begin: int = 0
    index_end: int = 1 << 62
    tag: RequestTag | None = None
    forwarded: bool = False
    sync: bool = False  # a resync worker removing what the chain no longer has
    from_target: int = 0
    # a trim of a live file: every chunk of the range becomes an empty *new version* (a truncate
    # to 0 through the chain) instead of disappearing, so a chunk that grows again continues its
    # version numbers and a replica that missed the trim is repaired, never confused by a
    # version number that names other bytes; at the head only (deleted files are removed)
    keep_versions: bool = False
    # a fenced trim (meta's trimmer): (index, version) pairs, flattened, of the newest version
    # the trimmer saw at the head for each chunk of the range; a chunk that has a newer one now
    # (written after the trimmer looked: a late copy of an old trim must not cut it) or that
    # was not listed is left alone, and the reply is VERSION_MISMATCH (look again, re-send)
    fenced: bool = False
    expect_vers: list[int] = many()
    # more inodes removed the same way in the same request (GC batches deleted files per chain)
    more_inodes: list[int] = many()
    grant: bytes = b""  # a client's removal (a truncate): its write grant for ``inode``


@message
class RemoveChunksRsp(Message):
    removed: int = 0


@message
class ChunkMeta(Message):
    chunk: ChunkId | None = None
    commit_ver: int = 0
    update_ver: int = 0
    length: int = 0
    crc: int = 0
    tags: list[int] = many()  # the committed version's request tags, flattened triples


@message
class QueryChunksReq(Message):
    target_id: int = 0
    inode: int = 0  # 0 = all inodes
    index_begin: int = 0
    index_end: int = 1 << 62
    limit: int = 10000
    after: ChunkId | None = None  # with inode=0: only chunks after this one (paging a whole target)


@message
class QueryChunksRsp(Message):
    chunks: list[ChunkMeta] = many()
    more: bool = False


@message
class ReportCorruptReq(Message):
    """A client read a chunk whose bytes failed their CRC32C on this target (a whole-chunk
    read is checked at the client only): the node checks the chunk and repairs it now."""

    target_id: int = 0
    chunk: ChunkId | None = None


WRITE = method(SERVICE_STORAGE, 1, "write", WriteReq, WriteRsp, idempotent=True)  # tag-deduped
READ = method(SERVICE_STORAGE, 2, "read", ReadReq, ReadRsp, idempotent=True)
TRUNCATE = method(SERVICE_STORAGE, 3, "truncate", TruncateReq, WriteRsp, idempotent=True)
REMOVE_CHUNKS = method(SERVICE_STORAGE, 4, "remove_chunks", RemoveChunksReq, RemoveChunksRsp, idempotent=True)
QUERY_CHUNKS = method(SERVICE_STORAGE, 5, "query_chunks", QueryChunksReq, QueryChunksRsp, idempotent=True)
STORAGE_PING = method(SERVICE_STORAGE, 6, "ping", Empty, Empty, idempotent=True)
REPORT_CORRUPT = method(SERVICE_STORAGE, 7, "report_corrupt", ReportCorruptReq, Empty, idempotent=True)


@message
class SyncFlushReq(Message):
    """The end of a resync: before it reports the resync done, the predecessor asks the syncing
    target to make every copy it received durable (resync copies commit without fsync), so a
    target mgmtd makes serving holds what it serves on its disk."""

    chain_id: int = 0
    chain_version: int = 0
    from_target: int = 0  # the predecessor (the resync source)


# chain peers only (the handler refuses anyone without SERVICE, admins included)
SYNC_FLUSH = method(SERVICE_STORAGE, 8, "sync_flush", SyncFlushReq, Empty, idempotent=True, needs=Right.SERVICE)
