"""The reads of a checkpoint load on the client's loop: ``read_files``.

A chunk whose every byte the load wants (items lie back to back in a data file, so a rank
reading its own files wants all of them) is read whole, with one READ whose reply lands
straight in the destinations that cover it (one buffer, or a ``Scatter`` of several: the
items in it). Storage then sends the chunk with its stored CRC and checks nothing on its side;
the client checks every byte against that CRC on arrival (end to end, as for any whole-chunk
read). A part of a chunk makes storage check the CRC of each block it reads and join them (a
second pass over every byte, and a copy out of its scratch), which on a 2-core host was half
the CPU a load spends. Cold 512 MiB single-process loads from one local cluster, 8 MiB items,
5 rounds alternating (load average ~5): aligned 4 MiB parts 684 MiB/s median (client 0.27,
storage 0.31-0.45 CPU-s), whole chunks 1242 MiB/s (0.17, 0.18).

The rest (a chunk only partly wanted: resharding, a batch edge, another layout's file) is read
with ``pread`` in pieces within one chunk and one aligned ``piece_bytes`` part of it, as before.
An inline or erasure-coded file, or a client without a storage client, is read with ``pread``
only.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Awaitable, Callable
from typing import Any

from loomfs.checkpoint._holds import ReadHolds

PIECE_BYTES = 4 << 20  # a read piece where the file's chunk size is unknown
# the largest piece of a chunk read in parts (whole chunks are read whole, above)
PIECE_MAX_BYTES: int | None = 4 << 20


@dataclasses.dataclass(frozen=True, slots=True)
class WholeChunk:
    """One READ of chunk ``index`` (``length`` bytes: the file's end may cut the last one)
    into ``parts``, which cover it in order."""

    index: int
    length: int
    parts: tuple[memoryview, ...]

    def __repr__(self) -> str:
        return f"WholeChunk({self.index}, {self.length}, parts={len(self.parts)})"


def plan_file(reads: list[tuple[int, memoryview]], chunk_size: int, file_length: int | None,
              piece_bytes: int | None) -> tuple[list[WholeChunk], list[tuple[int, memoryview]]]:
    """Split one file's ``(offset, buffer)`` reads into whole-chunk reads (a chunk covered
    exactly, no gap, no overlap, by the buffers) and pieces ``(file offset, buffer)`` (the
    rest: within one chunk and one aligned ``piece_bytes`` part of it). ``file_length`` None:
    pieces only. No I/O."""
    chunk = chunk_size or PIECE_BYTES
    per_chunk: dict[int, list[tuple[int, memoryview]]] = {}
    for offset, view in reads:
        pos = 0
        while pos < len(view):
            at = offset + pos
            n = min(len(view) - pos, chunk - at % chunk)
            per_chunk.setdefault(at // chunk, []).append((at % chunk, view[pos:pos + n]))
            pos += n
    part = piece_bytes if piece_bytes and chunk % piece_bytes == 0 else chunk
    wholes: list[WholeChunk] = []
    pieces: list[tuple[int, memoryview]] = []
    for index, parts in per_chunk.items():
        parts.sort(key=lambda p: p[0])
        if file_length is not None and chunk_size:
            length = min(chunk, file_length - index * chunk)
            if _covers(parts, length):
                wholes.append(WholeChunk(index, length, tuple(v for _o, v in parts)))
                continue
        for off, view in parts:
            pos = 0
            while pos < len(view):
                n = min(len(view) - pos, part - (off + pos) % part)
                pieces.append((index * chunk + off + pos, view[pos:pos + n]))
                pos += n
    return wholes, pieces


def _covers(parts: list[tuple[int, memoryview]], length: int) -> bool:
    """Whether ``parts`` (sorted by chunk offset) are ``[0, length)`` exactly, back to back."""
    end = 0
    for off, view in parts:
        if off != end:
            return False  # a gap, or an overlap (two items reading the same bytes)
        end += len(view)
    return length > 0 and end == length


def _whole_chunks_ok(client: Any, f: Any) -> bool:
    """Whether ``f``'s chunks may be read with the storage client directly: a replicated
    file in chunks (not inline, not erasure-coded) of a client that has one."""
    storage = getattr(client, "storage", None)
    layout = getattr(f, "layout", None)
    return (storage is not None and hasattr(storage, "read_chunk") and layout is not None
            and getattr(f, "inline", True) is False and not getattr(layout, "ec_k", 0)
            and isinstance(getattr(f, "length", None), int) and bool(getattr(f, "inode", 0)))


async def run_jobs(jobs: list[Callable[[], Awaitable[None]]], inflight: int) -> None:
    """Run ``jobs`` in order, ``inflight`` at a time (as many workers, so a load of millions
    of reads keeps ``inflight`` coroutines, not one task per read). The first failure ends the
    run: no job starts after it, those in flight are cancelled (a read cancelled mid-reply
    writes no more into its buffer once its cancellation returns), and it is raised. A load
    without resharding is one batch: without this, its first failed read (a dead chain's, each
    waiting out the call timeout) surfaced only after every other read of the checkpoint."""
    todo = iter(jobs)
    stop = False

    async def worker() -> None:
        nonlocal stop
        for job in todo:
            if stop:
                return
            try:
                await job()
            except BaseException:
                stop = True
                raise

    tasks = [asyncio.ensure_future(worker()) for _ in range(max(1, min(inflight, len(jobs))))]
    try:
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    except BaseException:  # cancelled: the workers too, and wait for them
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for t in tasks:  # the failure that ended the run (done first), not our cancellations
        if t in done:
            if t.cancelled():
                raise asyncio.CancelledError()  # a job cancelled from within: not read
            exc = t.exception()
            if exc is not None:
                raise exc


async def read_files(client: Any, reads: dict[str, list[tuple[int, memoryview]]], inflight: int,
                     piece_bytes: int | None = None, holds: ReadHolds | None = None) -> None:
    """Read every (offset, buffer) of every file: whole chunks where the buffers cover them,
    else pieces (``plan_file``), ``inflight`` reads at a time (``run_jobs``: the first failure
    ends them all); a short read raises EOFError, and so does a whole chunk storage holds fewer
    bytes of than the file's length says (a checkpoint's data files have no holes: a lost or
    cut chunk, which would otherwise load as zeros). Every file is read under a read hold
    (``_holds``): a checkpoint deleted or archived while it loads still reads its own bytes,
    and a hold that lapsed raises instead of zeros (checked before each read, and after the
    last). ``holds``: the load's holds, its files opened already (kept open after); without,
    the files are opened, held and closed here."""
    from loomfs.net.scatter import Scatter

    own = holds is None
    held = ReadHolds(client) if holds is None else holds

    async def piece(f: Any, path: str, offset: int, view: memoryview) -> None:
        held.check()
        got = 0
        while got < len(view):
            n = await f.pread(offset + got, view[got:])
            if not n:
                raise EOFError(f"{path}: short read ({got} of {len(view)} bytes at {offset})")
            got += n

    async def whole(f: Any, path: str, w: WholeChunk) -> None:
        held.check()
        into: Any = w.parts[0] if len(w.parts) == 1 else Scatter(w.parts)
        n = await client.storage.read_chunk(f.layout, f.inode, w.index, 0, w.length, into)
        if n < w.length:  # the rest was zero-filled
            held.check()  # a lapsed hold (its chunks collected) says so first
            raise EOFError(f"{path}: chunk {w.index} holds {n} of its {w.length} bytes (the file is {f.length} "
                           "bytes long): a lost or truncated chunk")

    try:
        files = await held.open_all(reads)
        jobs: list[Callable[[], Awaitable[None]]] = []
        for path, rs in reads.items():
            f = files[path]
            layout = getattr(f, "layout", None)
            chunk = int(getattr(layout, "chunk_size", 0) or 0)
            wholes, pieces = plan_file(rs, chunk, f.length if _whole_chunks_ok(client, f) else None, piece_bytes)
            jobs.extend(functools.partial(whole, f, path, w) for w in sorted(wholes, key=lambda w: w.index, reverse=True))
            # last piece first: a pread that continues the previous one counts as a sequential
            # stream, and the file then stages sub-chunk reads through its read-ahead cache (a
            # copy, and refetches when many are in flight); every byte here is asked for already
            pieces.sort(key=lambda p: p[0], reverse=True)
            jobs.extend(functools.partial(piece, f, path, off, v) for off, v in pieces)
        await run_jobs(jobs, inflight)
        await held.confirm()  # every hold lasted until the reads ended: what was read is the file's
    finally:
        if own:
            await held.close()
