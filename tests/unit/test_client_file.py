"""AsyncFile end to end over in-memory fake meta and storage (no sockets, no sleeps)."""

from __future__ import annotations

import asyncio
import errno
import os
import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from test_client_support import CHUNK, make_client

from loomfs.client.file import parse_mode
from loomfs.errors import LoomError


def run(fn: Callable[..., Awaitable[Any]], **config: object) -> Any:
    async def main() -> Any:
        client, meta, storage = make_client(**config)
        return await fn(client, meta, storage)

    return asyncio.run(main())


async def spin(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)  # yields to the loop; no wall-clock wait


def test_parse_mode() -> None:
    assert parse_mode("rb") == (os.O_RDONLY, True)
    assert parse_mode("wb") == (os.O_WRONLY | os.O_CREAT | os.O_TRUNC, True)
    assert parse_mode("ab") == (os.O_WRONLY | os.O_CREAT | os.O_APPEND, True)
    assert parse_mode("r+b") == (os.O_RDWR, True)
    assert parse_mode("xb") == (os.O_WRONLY | os.O_CREAT | os.O_EXCL, True)
    assert parse_mode("w+b") == (os.O_RDWR | os.O_CREAT | os.O_TRUNC, True)
    assert parse_mode("a+b") == (os.O_RDWR | os.O_CREAT | os.O_APPEND, True)
    assert parse_mode("r") == (os.O_RDONLY, False)
    for bad in ("", "rw", "rbb", "q", "bt", "rbt"):
        with pytest.raises(ValueError):
            parse_mode(bad)


def test_write_close_read_roundtrip_across_chunks() -> None:
    data = random.Random(1).randbytes(7 * CHUNK + 123)

    async def body(client: Any, meta: Any, storage: Any) -> None:
        f = await client.open("/f", "wb")
        for i in range(0, len(data), 777):
            await f.write(data[i : i + 777])
        await f.close()
        inode = meta.nodes["/f"].inode
        assert meta.closes[-1] == (inode, 100, len(data))  # exact length reported
        assert meta.nodes["/f"].size == len(data)
        assert storage.content(inode, len(data)) == data
        # whole chunks were sent as whole chunks, not byte-by-byte
        assert all(ln == CHUNK for (_, idx, off, ln) in storage.writes if idx < 7)
        r = await client.open("/f", "rb")
        assert await r.read() == data
        assert await r.read() == b""
        await r.seek(CHUNK - 10)
        assert await r.read(20) == data[CHUNK - 10 : CHUNK + 10]
        buf = bytearray(3 * CHUNK)
        await r.seek(5)
        assert await r.readinto(buf) == len(buf)
        assert buf == data[5 : 5 + len(buf)]
        await r.seek(-5, os.SEEK_END)
        assert await r.read(100) == data[-5:]
        assert r.tell() == len(data)
        await r.close()
        assert await client.cat("/f") == data

    run(body)


def test_random_writes_match_a_model() -> None:
    rng = random.Random(42)

    async def body(client: Any, meta: Any, storage: Any) -> None:
        f = await client.open("/m", "w+b")
        model = bytearray()
        for _ in range(200):
            op = rng.random()
            if op < 0.6:
                pos = rng.randrange(0, 6 * CHUNK)
                blob = rng.randbytes(rng.randrange(1, 2 * CHUNK))
                await f.seek(pos)
                await f.write(blob)
                if len(model) < pos:
                    model.extend(bytes(pos - len(model)))
                model[pos : pos + len(blob)] = blob
            elif op < 0.9:  # reads must see the file's own buffered writes
                pos = rng.randrange(0, 7 * CHUNK)
                n = rng.randrange(0, 3 * CHUNK)
                await f.seek(pos)
                assert await f.read(n) == bytes(model[pos : pos + n])
            else:
                await f.flush()
            assert f.length == len(model)
        await f.close()
        assert meta.nodes["/m"].size == len(model)
        inode = meta.nodes["/m"].inode
        assert storage.content(inode, len(model)) == bytes(model)
        assert await client.cat("/m") == bytes(model)

    run(body)


def test_holes_and_short_chunks_read_as_zeros() -> None:
    async def body(client: Any, meta: Any, storage: Any) -> None:
        f = await client.open("/h", "wb")
        await f.seek(3 * CHUNK + 10)
        await f.write(b"end")
        await f.close()
        assert meta.nodes["/h"].size == 3 * CHUNK + 13
        got = await client.cat("/h")
        assert got == bytes(3 * CHUNK + 10) + b"end"
        assert {idx for (_, idx, _, _) in storage.writes} == {3}

    run(body)


def test_full_chunk_flushes_in_background_and_budget_bounds_writers() -> None:
    async def body(client: Any, meta: Any, storage: Any) -> None:
        storage.write_gate = asyncio.Event()
        f = await client.open("/b", "wb")
        await f.write(b"a" * CHUNK)  # one full chunk: flushed in the background
        await spin()
        assert storage.inflight_writes == 1 and f.dirty
        await f.write(b"b" * CHUNK)  # writer continues while chunk 0 is in flight
        await spin()
        assert storage.inflight_writes == 2
        # the budget (2 chunks) is used up: the third full chunk makes the writer wait
        third = asyncio.ensure_future(f.write(b"c" * CHUNK))
        await spin()
        assert not third.done() and client.budget.waits == 1
        storage.write_gate.set()
        await third
        await f.close()
        assert await client.cat("/b") == b"a" * CHUNK + b"b" * CHUNK + b"c" * CHUNK
        assert client.budget.used_bytes == 0

    # 2048 bytes of budget = two 1000-byte chunks... budget counts chunk_size per flush
    run(body, write_buffer_bytes_max=2 * CHUNK)


def test_same_chunk_writes_land_in_order() -> None:
    async def body(client: Any, meta: Any, storage: Any) -> None:
        storage.held_writes = held = []
        f = await client.open("/o", "wb")
        await f.write(b"x" * 100)
        await f.seek(50)  # non-contiguous: the partial range is sent first
        await f.write(b"y" * 10)
        await f.seek(500)
        await spin()
        assert len(held) == 1  # the second write to chunk 0 waits for the first
        closing = asyncio.ensure_future(f.close())
        while not closing.done():
            # release the newest held write first: only ordering in the client keeps it right
            if held:
                held.pop().set_result(None)
            await spin()
        await closing
        assert await client.cat("/o") == b"x" * 50 + b"y" * 10 + b"x" * 40
        assert [w[2:] for w in storage.writes] == [(0, 100), (50, 10)]

    run(body)


def test_write_errors_surface_on_flush_and_close() -> None:
    async def body(client: Any, meta: Any, storage: Any) -> None:
        storage.fail_writes = True
        f = await client.open("/e", "wb")
        await f.write(b"z" * (CHUNK + 5))
        with pytest.raises(LoomError, match="disk on fire"):
            await f.flush()
        await f.write(b"more")
        with pytest.raises(LoomError, match="disk on fire"):
            await f.close()
        assert f.closed and not meta.sessions  # the write session was still closed
        assert client.budget.used_bytes == 0

    run(body)


def test_a_write_that_fails_part_way_does_not_claim_the_bytes_it_never_wrote() -> None:
    """Issue 15 item 10: a 40 MiB write that hit ENOSPC after 12 MiB left a 40 MiB file."""

    async def body(client: Any, meta: Any, storage: Any) -> None:
        storage.fail_index_from = 2
        f = await client.open("/full", "wb")
        await f.write(b"z" * (5 * CHUNK))
        with pytest.raises(LoomError) as err:
            await f.close()
        assert err.value.errno == errno.ENOSPC
        assert (await client.stat("/full")).size == 2 * CHUNK
        assert await client.cat("/full") == b"z" * (2 * CHUNK)

    run(body)


def test_sequential_small_reads_use_read_ahead() -> None:
    data = random.Random(3).randbytes(20 * CHUNK)

    async def body(client: Any, meta: Any, storage: Any) -> None:
        await client.pipe("/s", data)
        f = await client.open("/s", "rb")
        storage.reads.clear()
        out = bytearray()
        while chunk := await f.read(300):
            out += chunk
            assert len(f.cache) <= f.cache.capacity_chunks
        assert out == data
        # after the first read, chunks are fetched whole, once each, ahead of the reader
        whole = [r for r in storage.reads if r[2] == 0 and r[3] == CHUNK]
        assert len({r[1] for r in whole}) == 20
        assert len(storage.reads) <= 21
        assert f.cache.hits > 50
        await f.close()

    run(body, readahead_chunks=4)


def test_random_reads_do_not_read_ahead() -> None:
    data = random.Random(4).randbytes(10 * CHUNK)

    async def body(client: Any, meta: Any, storage: Any) -> None:
        await client.pipe("/r", data)
        f = await client.open("/r", "rb")
        storage.reads.clear()
        for pos in (5000, 100, 8000, 3000):
            await f.seek(pos)
            assert await f.read(50) == data[pos : pos + 50]
        assert storage.reads == [(2, p // CHUNK, p % CHUNK, 50) for p in (5000, 100, 8000, 3000)]
        assert len(f.cache) == 0
        await f.close()

    run(body)


def test_large_read_fans_out_bounded_by_parallel_chunks_max() -> None:
    data = random.Random(5).randbytes(12 * CHUNK)

    async def body(client: Any, meta: Any, storage: Any) -> None:
        await client.pipe("/l", data)
        f = await client.open("/l", "rb")
        storage.read_gate = asyncio.Event()
        buf = bytearray(len(data))
        task = asyncio.ensure_future(f.readinto(buf))
        await spin()
        assert storage.inflight_reads == 5  # 12 chunks, at most 5 at once
        storage.read_gate.set()
        assert await task == len(data)
        assert buf == data and storage.inflight_reads_max == 5
        await f.close()

    run(body, parallel_chunks_max=5)


def test_append_truncate_and_o_trunc() -> None:
    async def body(client: Any, meta: Any, storage: Any) -> None:
        await client.pipe("/t", b"a" * (3 * CHUNK))
        inode = meta.nodes["/t"].inode
        f = await client.open("/t", "ab")
        await f.write(b"b" * 10)
        await f.close()
        assert await client.cat("/t") == b"a" * (3 * CHUNK) + b"b" * 10
        await client.truncate("/t", CHUNK + 7)
        assert storage.truncates[-1] == (inode, 1, 7)
        assert storage.removes[-1][:2] == (inode, 2)
        assert sorted(k[1] for k in storage.chunks if k[0] == inode) == [0, 1]
        await client.truncate("/t", 2 * CHUNK)  # extending reads zeros, not stale bytes
        assert await client.cat("/t") == b"a" * (CHUNK + 7) + bytes(CHUNK - 7)
        f = await client.open("/t", "wb")  # O_TRUNC removes every chunk of the old content
        assert not any(k[0] == inode for k in storage.chunks)
        await f.write(b"new")
        await f.truncate(2)
        await f.close()
        assert await client.cat("/t") == b"ne"
        assert meta.nodes["/t"].size == 2

    run(body)


def test_fsync_reports_length_and_mode_checks() -> None:
    async def body(client: Any, meta: Any, storage: Any) -> None:
        f = await client.open("/y", "wb")
        await f.write(b"q" * 1500)
        await f.fsync()
        assert meta.syncs == [(meta.nodes["/y"].inode, 1500)]
        assert storage.content(meta.nodes["/y"].inode, 1500) == b"q" * 1500
        with pytest.raises(OSError):
            await f.read()
        await f.close()
        r = await client.open("/y", "rb")
        with pytest.raises(OSError):
            await r.write(b"x")
        await r.close()
        with pytest.raises(ValueError):
            await r.read()
        with pytest.raises(FileNotFoundError):
            await client.open("/missing", "rb")
        with pytest.raises(FileExistsError):
            await client.open("/y", "xb")

    run(body)


def test_readline() -> None:
    lines = [f"line {i} ".encode() * (i % 7 + 1) + b"\n" for i in range(300)]
    data = b"".join(lines) + b"tail"

    async def body(client: Any, meta: Any, storage: Any) -> None:
        await client.pipe("/lines", data)
        f = await client.open("/lines", "rb")
        got = []
        while line := await f.readline():
            got.append(line)
        assert got == lines + [b"tail"]
        await f.seek(0)
        assert await f.readline(3) == b"lin"
        await f.close()

    run(body)


def test_namespace_calls() -> None:
    async def body(client: Any, meta: Any, storage: Any) -> None:
        await client.makedirs("/a/b/c")
        await client.makedirs("/a/b/c", exist_ok=True)
        for name in ("x", "y", "z"):
            await client.pipe(f"/a/b/{name}", b"1")
        assert await client.ls("/a/b") == ["/a/b/c", "/a/b/x", "/a/b/y", "/a/b/z"]  # paged
        infos = await client.ls("/a/b", detail=True)
        assert [(i["name"], i["type"]) for i in infos][:2] == [("/a/b/c", "directory"), ("/a/b/x", "file")]
        assert await client.ls("/a/b/x") == ["/a/b/x"]
        walked = [w async for w in client.walk("/a")]
        assert walked == [("/a", ["b"], []), ("/a/b", ["c"], ["x", "y", "z"]), ("/a/b/c", [], [])]
        assert await client.exists("/a/b/../b/x") and not await client.exists("/a/q")
        await client.rm("/a/b/x")
        with pytest.raises(OSError):
            await client.rm("/a/b")  # not empty, not recursive
        await client.rm("/a", recursive=True)
        assert not await client.exists("/a") and list(meta.nodes) == ["/"]

    run(body)


def test_writes_and_sizes_past_the_largest_file_length_are_efbig() -> None:
    from loomfs.wire.types import FILE_BYTES_MAX

    async def body(client: Any, meta: Any, storage: Any) -> None:
        f = await client.open("/big", "wb")
        await f.seek(FILE_BYTES_MAX - 1)
        with pytest.raises(OSError) as e:
            await f.write(b"xy")
        assert e.value.errno == errno.EFBIG
        for call in (f.truncate(FILE_BYTES_MAX + 1), f.grow(FILE_BYTES_MAX + 1)):
            with pytest.raises(OSError) as e:
                await call
            assert e.value.errno == errno.EFBIG
        await f.write(b"x")  # up to the limit: fine
        await f.close()
        assert not storage.writes or all(idx * CHUNK < FILE_BYTES_MAX for (_, idx, _, _) in storage.writes)

    run(body)
