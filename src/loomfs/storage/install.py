"""Install a good whole copy of a chunk over the local one (scrub repair, resync pull).

The engine stages only versions newer than the committed one, so the old copy is removed
first; a failed stage (a disk error) would then leave the chunk missing here, which the chain
would take for a chunk this replica never had. So the stage is retried until it holds (the
good bytes are in memory), and readers are refused the chunk meanwhile (``replacing``). The
caller holds the chunk lock.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Protocol

import crc32c

from loomfs.common.retry import Backoff
from loomfs.storage.engine.types import ChunkKey, ChunkTag
from loomfs.storage.target import StorageTarget

logger = logging.getLogger(__name__)

INSTALL_BACKOFF = Backoff(0.05, 2.0)  # a stage that failed on a disk error is retried (the bytes are in memory)


class _Replacing(Protocol):
    replacing: set[tuple[int, ChunkKey]]


@dataclass(frozen=True, slots=True)
class KeptPending:
    """A pending version (read and checked before the install) staged again on top."""

    ver: int
    data: bytes
    tags: tuple[ChunkTag, ...]


async def install_copy(service: _Replacing, target: StorageTarget, key: ChunkKey, ver: int, data: memoryview,
                       tags: tuple[ChunkTag, ...], *, keep: KeptPending | None = None) -> None:
    """Make ``data`` the committed version ``ver`` of ``key`` on ``target``; ``keep``: the
    pending version the chunk had, staged again on top (it may be the only copy of a version
    the old tail committed and served)."""
    target.check_in_service()  # a failed target's disk is not touched (resync rebuilds it)
    service.replacing.add((target.target_id, key))  # reads refuse it meanwhile
    await target.engine.remove_range(key.inode, key.index, key.index + 1)
    attempt = 0
    while True:
        try:
            target.engine.stage_write(key, ver, 0, data, data_crc=crc32c.crc32c(data), full_replace=True, tags=tags)
            # durable: the copy replaces one the disk lost or rotted (and may be a checkpoint's)
            await target.engine.commit(key, ver, durable=True)
            service.replacing.discard((target.target_id, key))
            break
        except OSError as exc:  # LoomError included
            target.engine.abort(key)
            if target.failed:  # out of service now: nothing it holds is served; resync rebuilds it
                service.replacing.discard((target.target_id, key))
                raise
            logger.error("target %d chunk %s: installing a good copy of v%d failed (%s): retrying",
                         target.target_id, key, ver, exc)
            await asyncio.sleep(INSTALL_BACKOFF.delay_s(attempt))
            attempt += 1
    while keep is not None:
        try:
            target.engine.stage_write(key, keep.ver, 0, memoryview(keep.data), data_crc=crc32c.crc32c(keep.data),
                                      full_replace=True, tags=keep.tags)
            return
        except OSError as exc:
            target.engine.abort(key)
            if target.failed:
                raise
            logger.error("target %d chunk %s: staging pending v%d again failed (%s): retrying",
                         target.target_id, key, keep.ver, exc)
            await asyncio.sleep(INSTALL_BACKOFF.delay_s(attempt))
            attempt += 1
