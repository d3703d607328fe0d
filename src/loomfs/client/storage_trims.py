"""Truncates, trims and removals of chunks (meta's trimmer, GC, O_TRUNC): the ``StorageClient``
methods that change chunks other than by writing them. They go through the chain head with
``StorageClient._call_chain``, as writes do; a fenced one looks at the head's chunk versions
first and is refused if chunks were written after it looked.

A mixin: its methods run on a ``StorageClient`` (``client.storage_client``), whose
``__init__`` sets the state they use.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from loomfs.client.chunk_store import INDEX_END_ALL
from loomfs.common.keylocks import KeyLocks
from loomfs.errors import LoomError
from loomfs.wire.message import Message
from loomfs.wire.status import Status
from loomfs.wire.storage import (
    QUERY_CHUNKS,
    REMOVE_CHUNKS,
    TRUNCATE,
    ChunkId,
    QueryChunksReq,
    RemoveChunksReq,
    RequestTag,
    TruncateReq,
)
from loomfs.wire.types import Layout

if TYPE_CHECKING:
    from loomfs.net.rpc import Response
    from loomfs.wire.message import Method

logger = logging.getLogger("loomfs.client.storage_client")  # as before the split

FENCED_ATTEMPTS = 5  # a fenced trim looks again this often when chunks were written meanwhile
QUERY_PAGE = 10_000
REMOVE_BATCH = 1024  # deleted files per removal request (storage takes up to 4097)


class ChunkTrims:
    """``StorageClient``'s truncate and remove methods."""

    # set by StorageClient.__init__
    write_grants: dict[int, bytes]
    _chunk_updates: KeyLocks[tuple[int, int]]

    if TYPE_CHECKING:
        def _tag(self) -> RequestTag: ...

        async def _call_chain(self, chain_id: int, role: str, m: Method, make_req: Callable[[int, int], Message],
                              ) -> Response[Any]: ...

    async def truncate_chunk(self, layout: Layout, inode: int, index: int, length: int, *,
                             fenced: bool = False, if_ver_le: int = -1) -> None:
        """Cut chunk ``index`` to ``length``. ``fenced`` (meta's trimmer): only if the chunk
        was not written after this call looked at it (a copy of the call that arrives late,
        after a write that followed the trim, must not cut that write). ``if_ver_le`` >= 0:
        only if the chunk is no newer than that version (VERSION_MISMATCH, not retried)."""
        chain_id = layout.chains[index % len(layout.chains)]
        chunk = ChunkId(inode=inode, index=index)
        async with self._chunk_updates.hold((inode, index)):
            tag = self._tag()

            async def attempt() -> None:
                seen = (await self.head_versions(chain_id, inode, index, index + 1)).get(index, 0) if fenced else if_ver_le

                def make(version: int, target: int) -> Message:
                    return TruncateReq(
                        chain_id=chain_id, chain_version=version, chunk=chunk, length=length,
                        chunk_size=layout.chunk_size, tag=tag, if_ver_le=seen, durable=layout.durable,
                        grant=self.write_grants.get(inode, b""),
                    )

                await self._call_chain(chain_id, "head", TRUNCATE, make)

            await self._fenced(fenced, attempt, f"truncate of {inode}/{index}")

    async def remove_chunks(
        self, layout: Layout, inode: int, index_begin: int, index_end: int = INDEX_END_ALL, *,
        keep_versions: bool = False, fenced: bool = False,
    ) -> None:
        """Remove chunks [index_begin, index_end) of ``inode`` on every chain of the layout
        (``keep_versions``: a trim of a live file — chunks become empty new versions;
        ``fenced``: a trim that leaves alone chunks written after it looked, see
        ``truncate_chunk``)."""
        if index_end <= index_begin:
            return

        async def one(chain_id: int) -> None:
            async def attempt() -> None:
                tag = self._tag()  # each attempt a new request: chunks an earlier one cut are empty (skipped)
                seen: list[int] = []
                if fenced:
                    vers = await self.head_versions(chain_id, inode, index_begin, index_end)
                    seen = [x for iv in sorted(vers.items()) for x in iv]

                def make(version: int, target: int) -> Message:
                    return RemoveChunksReq(
                        chain_id=chain_id, chain_version=version, inode=inode,
                        index_begin=index_begin, index_end=index_end, tag=tag, keep_versions=keep_versions,
                        fenced=fenced, expect_vers=seen, grant=self.write_grants.get(inode, b""),
                    )

                await self._call_chain(chain_id, "head", REMOVE_CHUNKS, make)

            await self._fenced(fenced, attempt, f"trim of inode {inode} on chain {chain_id}")

        await asyncio.gather(*(one(c) for c in sorted(set(layout.chains))))

    async def _fenced(self, fenced: bool, attempt: Callable[[], Awaitable[None]], what: str) -> None:
        """Run ``attempt``; a fenced one refused because chunks were written after it looked
        (VERSION_MISMATCH) looks again, up to ``FENCED_ATTEMPTS`` times."""
        for n in range(FENCED_ATTEMPTS):
            try:
                await attempt()
                return
            except LoomError as exc:
                if not fenced or exc.status is not Status.VERSION_MISMATCH or n == FENCED_ATTEMPTS - 1:
                    raise
                logger.info("fenced %s: written meanwhile, looking again", what)

    async def head_versions(self, chain_id: int, inode: int, index_begin: int, index_end: int) -> dict[int, int]:
        """index -> newest version (committed or pending) of the inode's chunks in the range at
        the chain's head."""
        out: dict[int, int] = {}
        begin = index_begin
        while begin < index_end:
            def make(version: int, target: int, begin: int = begin) -> Message:
                return QueryChunksReq(target_id=target, inode=inode, index_begin=begin, index_end=index_end,
                                      limit=QUERY_PAGE)

            rsp = await self._call_chain(chain_id, "head", QUERY_CHUNKS, make)
            metas = [m for m in rsp.body.chunks if m.chunk is not None]
            for m in metas:
                assert m.chunk is not None
                out[m.chunk.index] = max(m.commit_ver, m.update_ver)
            last = metas[-1].chunk if metas else None
            if not rsp.body.more or last is None:
                return out
            begin = last.index + 1
        return out

    async def remove_file_chunks(self, inode: int, layout: Layout, length: int) -> None:
        """Remove every chunk of a file (GC, O_TRUNC).

        ``length`` is the recorded file length; all chunks of the inode are removed anyway,
        since a writer may have written past the length meta recorded.
        """
        await self.remove_chunks(layout, inode, 0, INDEX_END_ALL)

    async def remove_files_chunks(self, files: list[tuple[int, Layout]]) -> None:
        """Remove every chunk of many deleted files (GC): one request per chain for up to
        ``REMOVE_BATCH`` of them, instead of one per chain per file."""
        by_chain: dict[int, list[int]] = {}
        for inode, layout in files:
            for chain_id in sorted(set(layout.chains)):
                by_chain.setdefault(chain_id, []).append(inode)

        async def one(chain_id: int, inodes: list[int]) -> None:
            tag = self._tag()

            def make(version: int, target: int) -> Message:
                return RemoveChunksReq(chain_id=chain_id, chain_version=version, inode=inodes[0],
                                       more_inodes=inodes[1:], tag=tag)

            await self._call_chain(chain_id, "head", REMOVE_CHUNKS, make)

        await asyncio.gather(*(one(c, inodes[i:i + REMOVE_BATCH]) for c, inodes in sorted(by_chain.items())
                               for i in range(0, len(inodes), REMOVE_BATCH)))
