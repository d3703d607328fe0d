"""The chunk-store seam of the file layer (``ChunkStore``) and the helpers that its
implementation (``StorageClient``, ``client.storage_client``), the erasure-coded paths
(``client.ec_*``) and the client core share: READ requests with a read grant, payload CRCs,
zero fills, write/read grants kept from open replies, and the replica a chunk's reads go to.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

import crc32c

from loomfs.client.readgrants import ReadGrants
from loomfs.wire.status import Status
from loomfs.wire.storage import ReadReq
from loomfs.wire.types import Layout

INDEX_END_ALL = 1 << 62

# ReadReq.grant (issue 13's read grants) is being added to the wire types: until it is there,
# reads carry no grant and none is fetched
READ_REQ_HAS_GRANT = "grant" in getattr(ReadReq, "__dataclass_fields__", {})
GRANT_REFUSED = frozenset({Status.EACCES, Status.AUTH_EXPIRED})  # a READ whose grant storage refused


def read_req(grant: bytes, **fields: Any) -> ReadReq:
    """A ReadReq with ``fields``, carrying ``grant`` when there is one (and the field exists)."""
    if grant and READ_REQ_HAS_GRANT:
        fields["grant"] = grant
    return ReadReq(**fields)


_ZEROS = bytes(1 << 20)
# a write's CRC32C is taken on a worker thread from this size on (the library releases the GIL:
# the chunks of a flush hash on several cores while the loop sends); below it, on the loop
CRC_OFF_LOOP_BYTES = 1 << 20


async def payload_crc(data: memoryview) -> int:
    """CRC32C of ``data``; big ones on the loop's default executor."""
    if len(data) < CRC_OFF_LOOP_BYTES:
        return crc32c.crc32c(data)
    return await asyncio.get_running_loop().run_in_executor(None, crc32c.crc32c, data)


def zero_fill(view: memoryview) -> None:
    """Write zeros over ``view`` without allocating per call."""
    pos, n = 0, len(view)
    while pos < n:
        k = min(n - pos, len(_ZEROS))
        view[pos : pos + k] = _ZEROS[:k]
        pos += k


WRITE_GRANTS_MAX = 65536  # inodes whose write grant a client keeps


def note_grant(store: object, inode: int, reply: object) -> None:
    """Keep the write grant of an open/create reply (none from a meta without auth) in
    ``store.write_grants`` (a StorageClient; test fakes have none), and its read grant, when meta
    put one in (``read_grant``), in ``store.read_grants`` (no READ_GRANTS round trip then)."""
    read_grant = getattr(reply, "read_grant", b"")
    read_kept = getattr(store, "read_grants", None)
    if read_grant and isinstance(read_kept, ReadGrants):
        read_kept.note(inode, read_grant)
    grant = getattr(reply, "write_grant", b"")
    kept = getattr(store, "write_grants", None)
    if not grant or kept is None:
        return
    kept.pop(inode, None)
    kept[inode] = grant
    while len(kept) > WRITE_GRANTS_MAX:  # bounded: the oldest go (opening again gets a new one)
        del kept[next(iter(kept))]

_U64 = (1 << 64) - 1


def replica_pick(inode: int, index: int, stripe: int) -> int:
    """Which serving replica (modulo their number) reads of chunk ``index`` of ``inode`` go
    to: the same one from every client, so a chunk read again and again (a KV-cache block) is
    held by one replica's page cache, not by each in turn. The chunks of one file on one chain
    (every ``stripe``-th) take the replicas in turn, from a place that depends on the inode."""
    h = (inode * 0x9E3779B97F4A7C15) & _U64  # splitmix64's finalizer
    h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & _U64
    h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & _U64
    return (h ^ (h >> 31)) + index // max(1, stripe)


class ChunkStore(Protocol):
    """What the file layer needs from storage (a fake implements this in tests)."""

    async def read_chunk(
        self, layout: Layout, inode: int, index: int, offset: int, length: int, into: memoryview
    ) -> int: ...

    async def write_chunk(
        self, layout: Layout, inode: int, index: int, offset: int, data: memoryview
    ) -> int | None: ...

    async def truncate_chunk(self, layout: Layout, inode: int, index: int, length: int, *,
                             fenced: bool = False) -> None: ...

    async def remove_chunks(
        self, layout: Layout, inode: int, index_begin: int, index_end: int = INDEX_END_ALL, *,
        keep_versions: bool = False, fenced: bool = False,
    ) -> None: ...

    async def remove_file_chunks(self, inode: int, layout: Layout, length: int) -> None: ...

    async def remove_files_chunks(self, files: list[tuple[int, Layout]]) -> None: ...
