"""Byte movement for the fsspec layer, on the async core: byte ranges, and whole files
streamed between LoomFS and local disk (or LoomFS and LoomFS) in big blocks.

A block of ``BLOCK_BYTES`` spans several chunks, so each read fans out over the file's
stripe; local reads and writes run in a worker thread so the client's event loop keeps
serving other requests, and overlap with the LoomFS side (two buffers for a download; an
upload's chunk writes go on in the background while the next block is read from disk).
A destination is opened only once the first block is in hand, and a copy that fails after
that removes its partial file: a failed transfer leaves no half file behind.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO, cast

from loomfs.client.core import AsyncClient
from loomfs.client.file import AsyncFile

BLOCK_BYTES = 32 << 20  # one transfer step: 8 chunks of the default 4 MiB
WHOLE_READ_MAX_BYTES = 1 << 20  # files up to this are read (and written) in one call

Progress = Callable[[int, int], None]  # (bytes just moved, file size or -1)


def clamp_range(start: int | None, end: int | None, size: int) -> tuple[int, int]:
    """fsspec's ``start``/``end`` (None: the file's ends; negative: from the end) as
    ``0 <= s <= e <= size``."""
    s = 0 if start is None else (size + start if start < 0 else start)
    e = size if end is None else (size + end if end < 0 else end)
    s = min(max(s, 0), size)
    e = min(max(e, s), size)
    return s, e


async def pread(f: AsyncFile, start: int | None, end: int | None) -> bytes:
    """Bytes ``[start, end)`` of an open file."""
    s, e = clamp_range(start, end, f.length)
    if e <= s:
        return b""
    buf = bytearray(e - s)
    n = await f.pread(s, memoryview(buf))
    if n < len(buf):
        del buf[n:]
    return bytes(buf)


async def read_ranges(client: AsyncClient, path: str, ranges: Sequence[tuple[int | None, int | None]]) -> list[Any]:
    """Several ranges of one file: one open, the reads concurrently. Per range the bytes,
    or the error (an error of the open is every range's)."""
    try:
        f = await client.open(path, "rb")
    except OSError as exc:
        return [exc] * len(ranges)
    try:
        got = await asyncio.gather(*(pread(f, s, e) for s, e in ranges), return_exceptions=True)
    finally:
        await f.close()
    return list(got)


def _write_out(out: BinaryIO | str, data: bytes) -> None:
    if isinstance(out, str):
        with open(out, "wb") as fh:
            fh.write(data)
    else:
        out.write(data)


async def get_file(client: AsyncClient, rpath: str, out: BinaryIO | str, progress: Progress | None = None) -> int:
    """Stream a LoomFS file into a local path or open file; returns the bytes copied."""
    f = await client.open(rpath, "rb")
    try:
        size = f.length
        if size <= WHOLE_READ_MAX_BYTES:
            data = await f.read()
            await asyncio.to_thread(_write_out, out, data)
            if progress is not None:
                progress(len(data), size)
            return len(data)
        fh: BinaryIO = await asyncio.to_thread(open, out, "wb") if isinstance(out, str) else out
        try:
            return await _stream_out(f, size, fh, progress)
        finally:
            if fh is not out:
                await asyncio.to_thread(fh.close)
    finally:
        await f.close()


async def _stream_out(f: AsyncFile, size: int, out: BinaryIO, progress: Progress | None) -> int:
    block = min(BLOCK_BYTES, size)
    bufs = (bytearray(block), bytearray(block))
    writing: asyncio.Future[Any] | None = None
    off = k = 0
    try:
        while off < size:
            view = memoryview(bufs[k % 2])[: min(block, size - off)]
            got = await f.pread(off, view)  # meanwhile the previous block is written out
            if writing is not None:
                await writing
                writing = None
            if got == 0:
                break  # the file shrank meanwhile
            writing = asyncio.ensure_future(asyncio.to_thread(out.write, view[:got]))
            off += got
            k += 1
            if progress is not None:
                progress(got, size)
    finally:
        if writing is not None:
            await writing
    return off


def load_local(lpath: str) -> tuple[int, bytes | BinaryIO | None]:
    """(size, content) of a local file: its bytes when small, else the open file; a
    directory is (-1, None). Blocking: run it in a thread."""
    if os.path.isdir(lpath):
        return -1, None
    fh = open(lpath, "rb")  # noqa: SIM115 (the caller closes a big one)
    size = os.fstat(fh.fileno()).st_size
    if size > WHOLE_READ_MAX_BYTES:
        return size, fh
    with fh:
        return size, fh.read()


async def put_file(client: AsyncClient, src: BinaryIO, rpath: str, mode: str = "wb",
                   progress: Progress | None = None) -> int:
    """Stream the open local file ``src`` into LoomFS ``rpath`` (``mode`` "wb" or "xb");
    closes ``src``."""
    try:
        return await _put_stream(client, src, rpath, mode, progress)
    finally:
        await asyncio.to_thread(src.close)


async def _put_stream(client: AsyncClient, src: BinaryIO, rpath: str, mode: str,
                      progress: Progress | None) -> int:
    buf = bytearray(BLOCK_BYTES)
    view = memoryview(buf)
    n = await asyncio.to_thread(cast(Any, src).readinto, view)
    f = await client.open(rpath, mode)
    total = 0
    try:
        while n:
            await f.write(view[:n])  # copied into chunk buffers, sent in the background
            total += n
            if progress is not None:
                progress(n, -1)
            n = await asyncio.to_thread(cast(Any, src).readinto, view)
        await f.close()
    except BaseException:
        await _abandon(client, f, rpath)
        raise
    return total


async def copy_file(client: AsyncClient, src: str, dst: str, mode: str = "wb") -> int:
    """Copy a LoomFS file to another LoomFS path (a small file: one read, one put)."""
    f = await client.open(src, "rb")
    try:
        size = f.length
        if size <= WHOLE_READ_MAX_BYTES:
            data = await f.read()
            await write_whole(client, dst, data, mode)
            return len(data)
        buf = bytearray(min(BLOCK_BYTES, size))
        got = await f.pread(0, memoryview(buf))
        g = await client.open(dst, mode)
        off = 0
        try:
            while got:
                await g.write(memoryview(buf)[:got])
                off += got
                if off >= size:
                    break
                got = await f.pread(off, memoryview(buf)[: min(len(buf), size - off)])
            await g.close()
        except BaseException:
            await _abandon(client, g, dst)
            raise
        return off
    finally:
        await f.close()


async def write_whole(client: AsyncClient, path: str, data: bytes | bytearray | memoryview, mode: str = "wb") -> None:
    """``data`` as the whole content of ``path`` ("wb": one round trip for a small file;
    "xb": FileExistsError when it exists)."""
    if mode == "wb":
        await client.pipe(path, data)
        return
    f = await client.open(path, mode)
    try:
        await f.write(data)
    finally:
        await f.close()


async def _abandon(client: AsyncClient, f: AsyncFile, path: str) -> None:
    try:
        await f.close()
    except Exception:
        pass
    try:
        await client.unlink(path)
    except Exception:
        pass
