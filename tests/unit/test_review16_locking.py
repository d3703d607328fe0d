"""Review of session 16's AsyncFile I/O lock (68dc689, 5691d97, fdae983): calls that move the
position or fill the chunk buffer without holding it (the fakes of test_client_support; no
sockets, no sleeps)."""

from __future__ import annotations

import asyncio
from typing import Any

from test_client_hunt16_writes import FlakyStorage, run, until
from test_client_support import CHUNK


def test_a_stat_that_creates_a_lazy_file_does_not_move_a_concurrent_write() -> None:
    """A "w" file is created lazily; another task's stat of its path creates it now
    (``create_now``), and the directory answers "chunks": its buffer is written into chunk
    buffers (``_to_chunks``, which sets the position to each patch's offset) and waits for
    write budget half-way. A write meanwhile did not wait for that (create_now took only the
    create lock, not the I/O lock): it landed at the position ``_to_chunks`` had moved, and
    the rest of the buffer went after it: the acknowledged bytes are at the wrong offsets."""

    async def body(client: Any, meta: Any, storage: FlakyStorage) -> None:
        storage.write_gate = asyncio.Event()
        g = await client.open("/g", "w+b")  # created at open: holds the whole budget
        await g.write(b"g" * CHUNK)
        await until(lambda: storage.inflight_writes == 1)
        f = await client.open("/z", "wb")
        assert f.inline  # lazy: buffered, not created yet
        await f.write(b"a" * 2500)
        stat = asyncio.ensure_future(client.stat("/z"))  # creates it: its buffer into chunks
        await until(lambda: client.budget.waits == 1)
        writing = asyncio.ensure_future(f.write(b"b" * 10))
        for _ in range(20):
            await asyncio.sleep(0)
        storage.write_gate.set()
        await stat
        assert await writing == 10
        await f.close()
        await g.close()
        got = await client.cat("/z")
        assert got == b"a" * 2500 + b"b" * 10, (len(got), got[995:1015])

    run(body, write_buffer_bytes_max=CHUNK, inline_put_max_bytes=5000)


def test_a_seek_made_while_a_read_waits_is_not_lost() -> None:
    """One file object, two tasks (or two threads of the blocking API): a read at position
    1000 waits for storage; a seek to 0 is made meanwhile. Either order gives a position of
    0 or 1100 after both; the read adds what it got to the position the seek set (100)."""

    async def body(client: Any, meta: Any, storage: FlakyStorage) -> None:
        f = await client.open("/s", "w+b")
        await f.write(bytes(range(256)) * 12)
        await f.flush()
        await f.seek(1000)
        storage.read_gate = asyncio.Event()
        reading = asyncio.ensure_future(f.read(100))
        await until(lambda: storage.inflight_reads == 1)
        seeking = asyncio.ensure_future(f.seek(0))
        for _ in range(20):
            await asyncio.sleep(0)
        storage.read_gate.set()
        got = await reading
        assert await seeking == 0
        assert got == (bytes(range(256)) * 12)[1000:1100]
        assert f.tell() in (0, 1100), f.tell()
        await f.close()

    run(body)


def test_a_write_made_while_a_read_waits_lands_after_it_or_is_read_by_it() -> None:
    """A read of [0, 100) waits for storage; a write of 10 bytes meanwhile. POSIX has them
    atomic to each other (Python's BufferedRandom holds one lock for both): the write lands
    at 100 (read first), or at 0 and the read returns it (write first). The write landed at
    0 while the read returned the old bytes there."""

    async def body(client: Any, meta: Any, storage: FlakyStorage) -> None:
        f = await client.open("/w", "w+b")
        await f.write(b"o" * 300)
        await f.flush()
        await f.seek(0)
        storage.read_gate = asyncio.Event()
        reading = asyncio.ensure_future(f.read(100))
        await until(lambda: storage.inflight_reads == 1)
        writing = asyncio.ensure_future(f.write(b"N" * 10))
        for _ in range(20):
            await asyncio.sleep(0)
        storage.read_gate.set()
        got = await reading
        await writing
        await f.close()
        content = await client.cat("/w")
        read_first = got == b"o" * 100 and content == b"o" * 100 + b"N" * 10 + b"o" * 190
        write_first = got == b"N" * 10 + b"o" * 90 and content == b"N" * 10 + b"o" * 290
        assert read_first or write_first, (got[:12], content[:12], content[95:115])

    run(body)
