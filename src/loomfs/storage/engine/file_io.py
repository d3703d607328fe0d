"""The file engine's I/O policy: when to go through O_DIRECT, when to leave the event loop,
and positioned reads/writes that fill short files with zeros."""

from __future__ import annotations

import ctypes
import os

SCRATCH_BYTES = 1 << 20  # a multiple of BLOCK_BYTES
OFFLOAD_MIN_BYTES = 512 << 10  # requests this big do their disk I/O in the thread pool
DIRECT_READ_MIN_BYTES = 256 << 10  # smaller reads go through the page cache (hot small reads)
DIRECT_WRITE_MIN_BYTES = 256 << 10  # smaller writes too: an O_DIRECT 4 KiB write waits for the disk
IO_THREADS = 2
DIRECT_ALIGN_BYTES = 4096  # O_DIRECT: buffer address, file offset and length multiples of this


def _address(mv: memoryview | bytes) -> int:
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(mv))
    except TypeError:  # read-only buffer (bytes): not usable for O_DIRECT anyway
        return 1


def _direct_ok(mv: memoryview | bytes, offset: int) -> bool:
    """Can this buffer/offset go through O_DIRECT? (Pooled buffers are page-aligned mmaps.)"""
    return (
        len(mv) >= DIRECT_ALIGN_BYTES
        and offset % DIRECT_ALIGN_BYTES == 0
        and _address(mv) % DIRECT_ALIGN_BYTES == 0
    )


def _pread(fd: int, view: memoryview, pos: int) -> None:
    """Fill ``view`` from ``pos``; bytes past the end of the file read as zeros (a file shorter
    than the index says: its blocks then fail their CRC)."""
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], pos + got)
        if n <= 0:
            break
        got += n
    while got < len(view):
        step = min(len(view) - got, SCRATCH_BYTES)
        view[got : got + step] = _ZERO_MV[:step]
        got += step


def _pwrite_at(fd: int, data: memoryview | bytes, offset: int) -> None:
    """pwrite ``data`` at ``offset`` (at or past the end); an empty write still makes the file
    reach ``offset``, so a gap is in the file as the index says, not past its end."""
    if len(data):
        os.pwrite(fd, data, offset)
    else:
        os.ftruncate(fd, max(offset, os.fstat(fd).st_size))


_ZERO_MV = memoryview(bytes(SCRATCH_BYTES))


_NOWAIT = getattr(os, "RWF_NOWAIT", None)
_PROBE = memoryview(bytearray(1))


def in_page_cache(fd: int, offset: int, length: int) -> bool | None:
    """Whether ``fd``'s first, middle and last byte of ``[offset, offset + length)`` are in the
    page cache; None where the kernel or the file system cannot say (no ``RWF_NOWAIT``)."""
    if _NOWAIT is None:
        return None
    for pos in {offset, offset + length // 2, offset + length - 1}:
        try:
            if os.preadv(fd, [_PROBE], pos, _NOWAIT) != 1:
                return False
        except BlockingIOError:
            return False
        except OSError:  # EOPNOTSUPP and the like: this file system cannot tell
            return None
    return True
