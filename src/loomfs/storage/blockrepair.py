"""Block-level repair: rebuild a rotten chunk version from other replicas' copies of *any*
version, one ``BLOCK_BYTES`` block at a time.

The scrubber's last resort, when no member holds an intact copy of this replica's version nor
a newer committed one. That happens when the rot sat in a whole block that an update carried
along unread: an append continues the stored CRC of every earlier block without reading it
(``engine.base``), so rot in block 0 of v1 is carried into v2, and if this replica was the only
serving member when v2 was written, no other replica has v2 at all. The other members (out of
service, syncing or waiting) still hold v1, whose block 0 is the same content as v2's.

Every block of a version has a stored CRC32C recorded when its bytes were last written (kept
blocks keep theirs: rot is never blessed), so a block is taken from another copy only where
those bytes match the CRC this replica stored for that block (the whole-chunk CRC, checked
too, follows from the block CRCs: each block's 32-bit CRC is what decides). The version number
keeps naming the same content: nothing is recomputed over unchecked bytes. A member that fails
other than "no such version" or "rotten block" is left out after its first failure, so a hung
one costs one fetch timeout, not one per block.

The same applies to a pending version staged on top of the rotten one (it carries the rot
too): its rotten blocks are patched from the repaired committed bytes where they match its own
stored block CRCs (``patched_pending``), so a leftover the old tail may have served is kept.
"""

from __future__ import annotations

import logging
import struct
from typing import TYPE_CHECKING

import crc32c

from loomfs.common.routing import Routing
from loomfs.errors import LoomError
from loomfs.storage.engine.blocks import bad_blocks, block_crcs_of
from loomfs.storage.engine.types import BLOCK_BYTES, ChunkKey, ChunkState
from loomfs.storage.install import KeptPending
from loomfs.storage.target import StorageTarget
from loomfs.wire.status import Status
from loomfs.wire.storage import QUERY_CHUNKS, READ, ChunkId, QueryChunksReq, ReadReq

# answers about one block of one version (the next block or version may still be there); any
# other failure leaves the member out of this rebuild
BLOCK_MISSES = frozenset({Status.VERSION_MISMATCH, Status.CHECKSUM_MISMATCH, Status.EAGAIN})

if TYPE_CHECKING:
    from loomfs.storage.service import StorageService

logger = logging.getLogger(__name__)


def bad_block_indexes(data: memoryview | bytes | bytearray, stored: list[int]) -> list[int]:
    """Indexes of the blocks of ``data`` whose CRC32C is not the stored one (a block ``data``
    is too short to hold is bad)."""
    return bad_blocks(struct.pack(f"<{len(stored)}I", *stored), block_crcs_of(data))


def patch_blocks(into: bytearray, length: int, bad: list[int], stored: list[int],
                 source: memoryview | bytes | bytearray) -> list[int]:
    """Copy each block ``i`` in ``bad`` (extent [i*B, min((i+1)*B, length)) of ``into``) from
    the same extent of ``source`` when ``source`` covers it and its bytes match ``stored[i]``;
    returns the blocks still bad."""
    src = memoryview(source)
    left = []
    for i in bad:
        start, end = i * BLOCK_BYTES, min((i + 1) * BLOCK_BYTES, length)
        if i < len(stored) and end <= len(src) and crc32c.crc32c(src[start:end]) == stored[i]:
            into[start:end] = src[start:end]
        else:
            left.append(i)
    return left


async def rebuild_from_blocks(service: StorageService, target: StorageTarget, key: ChunkKey, st: ChunkState,
                              routing: Routing, chain_id: int, others: list[int],
                              timeout_s: float) -> bytearray | None:
    """The committed version ``st`` of ``key`` rebuilt from this replica's good blocks and
    ``others``' copies (their committed version, and their pending one where they are out of
    service) of the bad ones; None when some block is found nowhere, or when the rebuilt bytes
    are not the recorded chunk (CRC, length). Holds no lock while fetching: the caller installs
    the result only if the chunk did not change meanwhile."""
    try:
        stored = target.engine.block_crcs(key)
        buf = bytearray(st.length)
        n = await target.engine.aread(key, 0, memoryview(buf))  # a whole-chunk read: not checked here
    except OSError as exc:  # LoomError included: the chunk changed or the disk fails
        logger.warning("scrub: target %d chunk %s: no block rebuild: %s", target.target_id, key, exc)
        return None
    bad = bad_block_indexes(memoryview(buf)[:n], stored) if n == st.length else list(range(len(stored)))
    if not bad or len(stored) != (st.length + BLOCK_BYTES - 1) // BLOCK_BYTES:
        return None  # every block matches its CRC, yet the chunk does not: nothing to take
    wanted = len(bad)
    for other in others:
        bad = await _patch_from(service, routing, chain_id, other, key, buf, st.length, bad, stored, timeout_s)
        if not bad:
            break
    if bad:
        logger.error("scrub: target %d chunk %s v%d: blocks %s found intact on no other member", target.target_id,
                     key, st.commit_ver, bad[:8])
        return None
    if crc32c.crc32c(buf) != st.crc:
        logger.error("scrub: target %d chunk %s v%d: rebuilt blocks do not make the recorded chunk",
                     target.target_id, key, st.commit_ver)
        return None
    logger.warning("scrub: target %d chunk %s v%d: %d rotten block(s) rebuilt from other members' copies",
                   target.target_id, key, st.commit_ver, wanted)
    return buf


async def _patch_from(service: StorageService, routing: Routing, chain_id: int, other: int, key: ChunkKey,
                      into: bytearray, length: int, bad: list[int], stored: list[int], timeout_s: float) -> list[int]:
    """Patch ``bad`` blocks of ``into`` from ``other``'s committed version, then its pending one
    (a repair read gets a pending version only from a member out of service), one block per
    read (a block rotten there too fails alone); returns the blocks still bad."""
    address = routing.address_of(other)
    chain_version = routing.chain(chain_id).version
    q = QueryChunksReq(target_id=other, inode=key.inode, index_begin=key.index, index_end=key.index + 1, limit=1)
    try:
        metas = (await service.rpc.call(address, QUERY_CHUNKS, q, timeout_s=timeout_s)).body.chunks
    except (LoomError, OSError) as exc:
        logger.warning("scrub: chunk %s metadata from target %d failed: %s", key, other, exc)
        return bad
    m = metas[0] if metas and metas[0].chunk is not None and metas[0].chunk.index == key.index else None
    for ver in (m.commit_ver, m.update_ver) if m is not None else ():
        if not ver:
            continue
        for i in list(bad):
            start, end = i * BLOCK_BYTES, min((i + 1) * BLOCK_BYTES, length)
            req = ReadReq(chain_id=chain_id, chain_version=chain_version,
                          chunk=ChunkId(inode=key.inode, index=key.index), offset=start, length=end - start,
                          target_id=other, exact_ver=ver)
            try:
                got = (await service.rpc.call(address, READ, req, timeout_s=timeout_s)).payload
            except (LoomError, OSError) as exc:
                if getattr(exc, "status", None) in BLOCK_MISSES:  # not there, or rotten there too
                    logger.info("scrub: block %d of chunk %s v%d from target %d: %s", i, key, ver, other, exc)
                    continue
                # unreachable, timed out, refused: the member's other blocks would wait as long
                logger.warning("scrub: block rebuild of chunk %s: target %d left out: %s", key, other, exc)
                return bad
            if len(got) == end - start and crc32c.crc32c(got) == stored[i]:
                into[start:end] = got
                bad.remove(i)
        if not bad:
            break
    return bad


def patched_pending(target: StorageTarget, key: ChunkKey, st: ChunkState, good: memoryview | bytes | bytearray,
                    ) -> KeptPending | None:
    """The chunk's pending version with its rotten blocks taken from ``good`` (the repaired
    committed bytes) where those match the pending version's stored block CRCs; None when it
    cannot be made intact (its whole CRC decides)."""
    if not st.has_pending:
        return None
    try:
        stored = target.engine.block_crcs(key, pending=True)
        buf = bytearray(st.pending_length)
        n = target.engine.read(key, 0, memoryview(buf), pending=True)
    except OSError:
        return None
    if n != st.pending_length:
        return None
    left = patch_blocks(buf, n, bad_block_indexes(buf, stored), stored, good)
    if left or crc32c.crc32c(buf) != st.pending_crc:
        return None
    return KeptPending(st.pending_ver, bytes(buf), st.pending_tags)
