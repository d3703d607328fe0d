"""The ChunkEngine seam: one engine per storage target (one directory per disk).

A chunk is addressed by ``ChunkKey(inode, index)``. Per chunk the engine keeps the committed
version (readable), at most one pending update version (staged, invisible to readers until
committed), the committed length, the CRC32C of the committed content (what the wire carries for
whole-chunk reads) and the CRC32C of every ``BLOCK_BYTES`` block of it (the last one may be
short), so a partial read is checked against the disk too: a read that is not the whole chunk
from offset 0 verifies every block it touches and fails with ``CHECKSUM_MISMATCH``.

Crash semantics, shared by every engine (the conformance suite checks them): a crash loses
every pending update and nothing committed; after a crash each chunk holds exactly its last
committed version. ``commit`` is the only step that changes what readers see.

Versions: ``stage_*`` takes the update version the chain assigned; it must be newer than the
committed version. Staging again replaces the pending update (a re-forwarded update).

Bit rot and updates (the conformance suite checks this): an update never computes a new CRC over
committed bytes it has not checked, so rot on disk is never "blessed" into a version with valid
CRCs. A stage that keeps bytes of the committed version and reads or rehashes them (an overwrite
that does not cover the whole committed content, a shrinking truncate) verifies every kept block
it copies against the committed version's stored block CRC, and a bad one fails the stage with
``StatusError(CHECKSUM_MISMATCH, "... block i at offset ...")``: nothing is staged, the chunk
keeps its committed version (still readable: its good blocks; ``verify`` still reports the bad
ones), and a pending update staged before is dropped too (staging replaces it anyway; the same as
a failed stage that began). Blocks the update covers whole are not kept and not checked: a write
that covers a rotten block whole, a truncate that cuts it away, and a full replace (the repair)
succeed. Appends and zero-extending truncates read no old byte: they continue the stored block
CRC of the old last block and the stored whole-chunk CRC, so they succeed and the rot stays
visible (to partial reads, ``verify``, and the reader's whole-chunk CRC check).

Request tags (retry dedupe that survives a change of head, as in 3FS): each version carries up to
``TAGS_MAX`` ``ChunkTag(client_id, request_id, version)``, oldest first, persisted with the
chunk's metadata on every replica. ``stage_*(..., tags=...)`` gives the complete list the new
version will carry (the service computes it: the committed list plus the new request's tag, see
``tags_with``); ``tags=None`` keeps the committed version's list. An engine keeps the newest
``TAGS_MAX`` of a longer list, and refuses (InvalidArgument) a field outside 0..2**64-1. Tags
follow their version exactly: ``ChunkState.pending_tags`` shows the pending version's list,
``ChunkState.tags`` the committed one's; ``commit`` makes the pending list the committed one (in
the same index row write as the length and CRCs: no extra statement, no extra fsync); ``abort``
and a crash lose the pending list with the pending update and never the committed one;
``remove_range`` drops them with the chunk.
"""

from __future__ import annotations

import struct
from abc import ABC, abstractmethod
from collections.abc import Callable

from loomfs.storage.engine.blocks import bad_blocks, block_crcs_of, missing_chunk
from loomfs.storage.engine.types import INDEX_END, ChunkKey, ChunkState, ChunkTag, Usage


class ChunkEngine(ABC):
    """Chunk storage for one target. Reads are synchronous (page cache); commit may fsync."""

    # why a failed fsync took this target out of service ("" = healthy; see engine.diskfail)
    failed: str = ""
    # told (once, from any thread) when ``failed`` is set: the service stops serving the target
    on_failed: Callable[[str], None] | None = None
    # this process read every committed chunk back after a failed fsync (engine.diskfail): the
    # node tells mgmtd (TargetInfo.verified), which lets a target it saw fail serve again only then
    verified: bool = False
    # committed chunks that verification found not matching their rows: the scrubber repairs them
    suspect_chunks: list[ChunkKey] = []  # noqa: RUF012 - engines set their own list

    @abstractmethod
    def get(self, key: ChunkKey) -> ChunkState | None:
        """Current state of a chunk, or None when it has neither committed nor pending data."""

    @abstractmethod
    def read(self, key: ChunkKey, offset: int, into: memoryview, *, pending: bool = False) -> int:
        """Copy committed bytes [offset, offset+len(into)) into ``into``; returns bytes read
        (shorter at the end of the chunk). ``pending=True`` reads the pending update instead
        (re-forwarding). Raises NotFound when there is no such version. A committed read that is
        not the whole chunk from offset 0 checks every block it touches and raises
        StatusError(CHECKSUM_MISMATCH) on a bad one; a whole-chunk read is not checked here (the
        reader checks the whole-chunk CRC)."""

    @abstractmethod
    def block_crcs(self, key: ChunkKey, *, pending: bool = False) -> list[int]:
        """The stored CRC32C of each BLOCK_BYTES block of the committed (or pending) content."""

    def open_region(self, key: ChunkKey) -> tuple[int, int, int] | None:
        """(fd, length, crc) of ``key``'s committed version for a zero-copy send: ``fd`` is the
        caller's own (a dup; it closes it), its bytes [0, length) are the committed content
        (copy-on-write: never rewritten in place); None where the engine keeps no file, there is
        no committed version, or the target is out of service."""
        return None

    def verify(self, key: ChunkKey) -> list[int]:
        """Check the committed content against its block CRCs; returns the bad block indexes
        (empty: good). Generic version: one whole-chunk read into a fresh buffer."""
        st = self.get(key)
        if st is None or not st.commit_ver:
            raise missing_chunk(key)
        stored = self.block_crcs(key)
        buf = bytearray(st.length)
        self.read(key, 0, memoryview(buf))
        return bad_blocks(struct.pack(f"<{len(stored)}I", *stored), block_crcs_of(buf))

    @abstractmethod
    def stage_write(
        self,
        key: ChunkKey,
        version: int,
        offset: int,
        data: memoryview | bytes,
        *,
        data_crc: int | None = None,
        full_replace: bool = False,
        tags: tuple[ChunkTag, ...] | None = None,
    ) -> ChunkState:
        """Stage update ``version``: the committed content with ``data`` written at ``offset``
        (a gap past the end reads as zeros), or exactly ``data`` when ``full_replace``. ``tags``:
        the request tags the version carries once committed (None: the committed version's)."""

    async def aread(self, key: ChunkKey, offset: int, into: memoryview) -> int:
        """``read`` of committed data that may run off the event loop (big disk reads)."""
        return self.read(key, offset, into)

    async def astage_write(
        self,
        key: ChunkKey,
        version: int,
        offset: int,
        data: memoryview | bytes,
        *,
        data_crc: int | None = None,
        full_replace: bool = False,
        tags: tuple[ChunkTag, ...] | None = None,
        sync: bool = False,
    ) -> ChunkState:
        """``stage_write`` that may run its disk write off the event loop; ``sync`` (a durable
        write): the engine may start making the staged data durable at once, ahead of
        ``commit(durable=True)``, which still waits for all of it."""
        return self.stage_write(key, version, offset, data, data_crc=data_crc, full_replace=full_replace, tags=tags)

    @abstractmethod
    def stage_truncate(
        self, key: ChunkKey, version: int, length: int, *, tags: tuple[ChunkTag, ...] | None = None
    ) -> ChunkState:
        """Stage update ``version``: the committed content cut or zero-extended to ``length``
        (``tags`` as for ``stage_write``)."""

    @abstractmethod
    async def commit(self, key: ChunkKey, version: int, *, durable: bool = False) -> ChunkState:
        """Make pending ``version`` (and its tags) the committed one: durably (data and index
        on stable storage before this returns) when the engine fsyncs every commit or when
        ``durable`` asks for it (a write to a directory with the ``durable`` layout flag)."""

    def pending_durable(self, key: ChunkKey) -> bool:
        """Whether the pending update of ``key`` was staged for a durable write (every commit
        of it is then durable, and a forward of it asks successors for a durable commit)."""
        return False

    async def make_durable(self, key: ChunkKey) -> None:  # noqa: B027 - optional hook
        """Make the committed version of ``key`` durable (data, directory entry, index row on
        stable storage): before a durable write's retry is acked as already committed."""

    @abstractmethod
    def abort(self, key: ChunkKey) -> None:
        """Drop the pending update (and its tags), if any."""

    @abstractmethod
    async def remove_range(self, inode: int, index_begin: int = 0, index_end: int = INDEX_END) -> int:
        """Remove chunks [index_begin, index_end) of ``inode`` (committed and pending);
        returns how many chunks were removed."""

    @abstractmethod
    def list_chunks(
        self,
        inode: int = 0,
        index_begin: int = 0,
        index_end: int = INDEX_END,
        limit: int = 10000,
        *,
        after: ChunkKey | None = None,
    ) -> list[ChunkState]:
        """Up to ``limit`` chunks (committed or pending only) in (inode, index) order;
        ``inode=0`` lists all inodes (index range ignored). ``after`` resumes a listing: only
        chunks strictly greater than it in (inode, index) order (pass the last key of a page)."""

    @abstractmethod
    def usage(self) -> Usage: ...

    def start_verification(self) -> None:
        """mgmtd saw this target fail (a failed fsync) and this process did not verify it (the
        FSYNC_FAILED marker never reached the failing disk): check every committed chunk now,
        out of service meanwhile (``failed``), then set ``verified`` and ``suspect_chunks``.
        Nothing if the target is failed or verifying already. This default checks every
        chunk's blocks at once (an engine with no page cache to distrust)."""
        if self.failed:
            return
        bad: list[ChunkKey] = []
        after: ChunkKey | None = None
        while True:
            page = self.list_chunks(0, limit=10_000, after=after)
            bad += [st.key for st in page if st.commit_ver and self.verify(st.key)]
            if len(page) < 10_000:
                break
            after = page[-1].key
        self.suspect_chunks = bad
        self.verified = True

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release files; the engine is unusable afterwards."""
