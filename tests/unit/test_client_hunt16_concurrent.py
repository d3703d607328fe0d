"""Hunt 16: one file object written by several tasks (or threads of the blocking API, whose
calls run as tasks on one loop) at once: each call is atomic to the others."""

from __future__ import annotations

import asyncio
from typing import Any

from test_client_hunt16_writes import FlakyStorage, run, until
from test_client_support import CHUNK


def test_concurrent_writes_to_one_file_do_not_interleave() -> None:
    """Two tasks (or two threads of the blocking API, whose calls run as tasks on one loop)
    write one file object at its shared position. A write that waited for write budget to
    send a full chunk went on where the other write had left the position: its bytes were
    split around the other's (POSIX: writes to a regular file are atomic to each other)."""

    async def body(client: Any, meta: Any, storage: FlakyStorage) -> None:
        storage.write_gate = asyncio.Event()
        f = await client.open("/w", "wb")
        await f.write(b"x" * CHUNK)  # chunk 0 in flight, held: the budget (one chunk) is used up
        await until(lambda: storage.inflight_writes == 1)
        first = asyncio.ensure_future(f.write(b"b" * (2 * CHUNK)))  # chunk 1 full: waits for budget
        await until(lambda: client.budget.waits == 1)
        second = asyncio.ensure_future(f.write(b"c" * 10))
        for _ in range(50):
            await asyncio.sleep(0)
        storage.write_gate.set()
        await asyncio.gather(first, second)
        await f.close()
        got = await client.cat("/w")
        assert got in (b"x" * CHUNK + b"b" * (2 * CHUNK) + b"c" * 10,
                       b"x" * CHUNK + b"c" * 10 + b"b" * (2 * CHUNK)), got

    run(body, write_buffer_bytes_max=CHUNK)


def test_close_waits_for_a_write_in_progress() -> None:
    """A close from one thread while another's write waits for budget: the write went on
    after the close had sent what was buffered, returned, and its last bytes were never
    sent (while the close reported a length that counts them)."""

    async def body(client: Any, meta: Any, storage: FlakyStorage) -> None:
        storage.write_gate = asyncio.Event()
        f = await client.open("/cw", "wb")
        await f.write(b"x" * CHUNK)
        await until(lambda: storage.inflight_writes == 1)
        writing = asyncio.ensure_future(f.write(b"b" * (CHUNK + 10)))  # chunk 1 full: waits
        await until(lambda: client.budget.waits == 1)
        closing = asyncio.ensure_future(f.close())
        for _ in range(50):  # the close runs as far as it can
            await asyncio.sleep(0)
        storage.write_gate.set()
        await asyncio.gather(writing, closing, return_exceptions=True)
        assert closing.exception() is None
        if writing.exception() is None:  # the write returned: its bytes are in the file
            assert meta.nodes["/cw"].size == 2 * CHUNK + 10
            assert await client.cat("/cw") == b"x" * CHUNK + b"b" * (CHUNK + 10)
        else:
            assert isinstance(writing.exception(), ValueError)  # or it was refused (closed)

    run(body, write_buffer_bytes_max=CHUNK)


def test_writes_at_offsets_from_several_tasks_land_at_their_offsets() -> None:
    """The mount writes each WRITE request as a seek and a write of the inode's one client
    file, from as many tasks as requests in flight. With the I/O lock taken by each call,
    a seek queued behind a write waiting for budget came between another request's seek and
    its write: that write's bytes landed at the other request's offset (session 16).
    ``AsyncFile.pwrite`` does both in one hold of the lock."""

    async def body(client: Any, meta: Any, storage: FlakyStorage) -> None:
        storage.write_gate = asyncio.Event()
        f = await client.open("/p", "wb")
        await f.write(b"x" * CHUNK)  # chunk 0 in flight, held: the budget is used up
        await until(lambda: storage.inflight_writes == 1)
        filling = asyncio.ensure_future(f.write(b"y" * CHUNK))  # chunk 1 full: waits for budget
        await until(lambda: client.budget.waits == 1)
        a = asyncio.ensure_future(f.pwrite(3 * CHUNK, b"A" * 100))  # both queue on the lock
        b = asyncio.ensure_future(f.pwrite(3 * CHUNK + 1000, b"B" * 100))
        for _ in range(50):
            await asyncio.sleep(0)
        storage.write_gate.set()
        await asyncio.gather(filling, a, b)
        await f.close()
        got = await client.cat("/p")
        assert got[3 * CHUNK:3 * CHUNK + 100] == b"A" * 100
        assert got[3 * CHUNK + 1000:3 * CHUNK + 1100] == b"B" * 100
        assert got[3 * CHUNK + 100:3 * CHUNK + 1000] == bytes(900)

    run(body, write_buffer_bytes_max=CHUNK)
