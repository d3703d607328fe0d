"""The file engine's block-CRC work on chunk files: scanning a file's block CRCs, checking the
blocks an update keeps only in part before it copies them, checking a copy-on-write file in one
pass, computing block CRCs late for rows from before them, and reads that check every block they
touch (``file`` explains the scheme)."""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Callable

import crc32c

from loomfs.errors import StatusError
from loomfs.storage.engine.blocks import (
    block_crc,
    block_mismatch,
    check_blocks,
    crc_of_blocks,
    first_changed,
    kept_why,
)
from loomfs.storage.engine.file_fds import FdCache
from loomfs.storage.engine.file_index import ChunkIndex
from loomfs.storage.engine.file_io import (
    DIRECT_ALIGN_BYTES,
    DIRECT_READ_MIN_BYTES,
    SCRATCH_BYTES,
    _direct_ok,
    _pread,
)
from loomfs.storage.engine.file_rows import Meta
from loomfs.storage.engine.types import BLOCK_BYTES, ChunkKey
from loomfs.wire.status import Status


class BlockChecks(FdCache):
    """Mixin of ``FileEngine``: block CRCs of its chunk files."""

    _scratch: bytearray  # loop-thread only; pool threads use ``_thread_scratch``
    _tls: threading.local
    _index: ChunkIndex

    def _crc_of(self, fd: int, length: int) -> int:
        value, pos, mv = 0, 0, memoryview(self._scratch)
        while pos < length:
            n = os.preadv(fd, [mv[: min(SCRATCH_BYTES, length - pos)]], pos)
            if n <= 0:
                raise OSError(5, f"short chunk file while computing CRC at {pos}/{length}")
            value = crc32c.crc32c(mv[:n], value)
            pos += n
        return value

    def _crc_range(self, fd: int, start: int, end: int) -> int:
        """CRC32C of bytes [start, end) of a file (an edge block read back after a write)."""
        view = memoryview(self._scratch)[: end - start]
        _pread(fd, view, start)
        return crc32c.crc32c(view)

    def _scan_blocks(self, fd: int, length: int, *, whole: bool) -> tuple[bytes, int]:
        """(block CRCs, whole-chunk CRC if ``whole`` else 0) of the file's first ``length`` bytes
        (every byte hashed once: the whole-chunk CRC is joined from the block CRCs)."""
        crcs: list[int] = []
        mv = memoryview(self._scratch)
        for pos in range(0, length, SCRATCH_BYTES):
            piece = mv[: min(SCRATCH_BYTES, length - pos)]
            _pread(fd, piece, pos)
            crcs += [crc32c.crc32c(piece[off : off + BLOCK_BYTES]) for off in range(0, len(piece), BLOCK_BYTES)]
        blocks = struct.pack(f"<{len(crcs)}I", *crcs)
        return blocks, crc_of_blocks(blocks, length) if whole else 0

    def _check_old_blocks(self, key: ChunkKey, m: Meta, old_blocks: bytes, indexes: list[int], version: int) -> None:
        """Read the committed content of blocks ``indexes`` (those an update keeps only in part,
        at most two) and refuse the update if one no longer matches its stored CRC."""
        fd = self._fd(key, m.file_ver)
        for i in indexes:
            start = i * BLOCK_BYTES
            view = memoryview(self._scratch)[: min(BLOCK_BYTES, m.length - start)]
            _pread(fd, view, start)
            check_blocks(key, old_blocks, i, view, kept_why(version))

    def _check_copy(
        self, key: ChunkKey, fd: int, length: int, old_blocks: bytes, blocks: bytes, kept: tuple[range, range],
        version: int,
    ) -> int:
        """The whole-chunk CRC of a copy-on-write file just written, read back in one pass and
        checked against the CRC its new block CRCs (``blocks``: the stored ones of the blocks
        ``kept`` as they were) add up to. A difference means copied bytes were rotten: the block
        is found (a second pass, on this failure path only) and the stage refused."""
        crc = self._crc_of(fd, length)
        expect = crc_of_blocks(blocks, length)
        if crc == expect:
            return crc
        computed, _ = self._scan_blocks(fd, length, whole=False)
        i = first_changed(old_blocks, computed, kept)
        if i >= 0:
            raise block_mismatch(key, i, block_crc(old_blocks, i), block_crc(computed, i), kept_why(version))
        raise StatusError(
            Status.CHECKSUM_MISMATCH,
            f"chunk {key}: the new file of update v{version} does not match its block CRCs "
            f"(CRC {crc:08x}, expected {expect:08x}): refused",
        )

    def _known_blocks(self, key: ChunkKey, m: Meta) -> bytes:
        """``m``'s block CRCs; for a row from before block CRCs, computed from the file now
        (checked against the whole-chunk CRC) and stored in the index."""
        if m.blocks is not None:
            return m.blocks
        blocks, crc = self._scan_blocks(self._fd(key, m.file_ver), m.length, whole=True)
        if crc != m.crc:
            raise StatusError(
                Status.CHECKSUM_MISMATCH,
                f"chunk {key}: CRC mismatch (stored {m.crc:08x}, computed {crc:08x}) while computing "
                "its first block CRCs (index from before block CRCs)",
            )
        m.blocks = blocks
        self._index.set_blocks(key.inode, key.index, m.commit_ver, blocks)
        return blocks

    def _thread_scratch(self) -> memoryview:
        """Two blocks of scratch owned by the calling pool thread (allocated once per thread)."""
        buf = getattr(self._tls, "scratch", None)
        if buf is None:
            buf = self._tls.scratch = memoryview(bytearray(2 * BLOCK_BYTES))
        return buf

    def _fill(self, fd: int, direct_fd: Callable[[], int], view: memoryview, pos: int) -> None:
        """Read ``view`` from ``pos``: its 4 KiB-aligned body with O_DIRECT when it is big and
        aligned (``direct_fd()`` gives the fd, or -1), the rest through the page cache."""
        got = 0
        if self.direct_io and len(view) >= DIRECT_READ_MIN_BYTES and _direct_ok(view, pos):
            dfd = direct_fd()
            body = len(view) - len(view) % DIRECT_ALIGN_BYTES
            try:
                while 0 <= dfd and got < body:
                    n = os.preadv(dfd, [view[got:body]], pos + got)
                    got += max(0, n)
                    if n <= 0 or n % DIRECT_ALIGN_BYTES:
                        break  # end of file
            except OSError:
                self.direct_io = False
                got = 0
        _pread(fd, view[got:], pos + got)

    def _read_checked(
        self,
        key: ChunkKey,
        fd: int,
        direct_fd: Callable[[], int],
        into: memoryview,
        offset: int,
        length: int,
        blocks: bytes,
        scratch: memoryview,
    ) -> None:
        """Fill ``into`` from ``offset`` (not past ``length``), checking every block it touches:
        the blocks it covers whole are read into ``into`` and hashed there, the (at most two)
        it covers in part are read whole into ``scratch`` (2 blocks) and copied from."""
        end = offset + len(into)
        first, last = offset // BLOCK_BYTES, (end - 1) // BLOCK_BYTES
        last_end = min((last + 1) * BLOCK_BYTES, length)
        lo = first if offset % BLOCK_BYTES == 0 else first + 1  # blocks [lo, hi) are covered whole
        hi = last + 1 if end == last_end else last
        if lo >= hi:  # one or two partly covered blocks: one read of both
            start = first * BLOCK_BYTES
            view = scratch[: last_end - start]
            _pread(fd, view, start)
            check_blocks(key, blocks, first, view)
            into[:] = view[offset - start : end - start]
            return
        inner_start, inner_end = lo * BLOCK_BYTES, min(hi * BLOCK_BYTES, length)
        inner = into[inner_start - offset : inner_end - offset]
        self._fill(fd, direct_fd, inner, inner_start)
        check_blocks(key, blocks, lo, inner)
        if lo > first:  # head block: a whole one (blocks follow it)
            start = first * BLOCK_BYTES
            view = scratch[:BLOCK_BYTES]
            _pread(fd, view, start)
            check_blocks(key, blocks, first, view)
            into[: inner_start - offset] = view[offset - start :]
        if hi <= last:  # tail block
            start = last * BLOCK_BYTES
            view = scratch[: last_end - start]
            _pread(fd, view, start)
            check_blocks(key, blocks, last, view)
            into[start - offset :] = view[: end - start]
