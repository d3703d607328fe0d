"""Hunt 16: a write or seek cancelled while it waits for write budget loses no bytes of the
writes that returned before it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_client_hunt16_writes import FlakyStorage, run, until
from test_client_support import CHUNK


def test_a_cancelled_write_does_not_drop_earlier_acknowledged_bytes() -> None:
    """A write (asyncio.wait_for, Ctrl-C in the blocking API) is cancelled while it waits for
    budget to send a chunk buffer that also holds an earlier write that returned: that buffer
    used to be thrown away, and the length still counted its bytes (zeros in the file)."""

    async def body(client: Any, meta: Any, storage: FlakyStorage) -> None:
        storage.write_gate = asyncio.Event()
        f = await client.open("/k", "wb")
        await f.write(b"x" * CHUNK)
        await until(lambda: storage.inflight_writes == 1)
        await f.write(b"a" * 10)  # acknowledged, buffered in chunk 1
        writing = asyncio.ensure_future(f.write(b"b" * (CHUNK - 10)))  # fills chunk 1: waits for budget
        await until(lambda: client.budget.waits == 1)
        writing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await writing
        storage.write_gate.set()
        await f.close()
        got = await client.cat("/k")
        assert got[: CHUNK + 10] == b"x" * CHUNK + b"a" * 10
        assert got == b"x" * CHUNK + b"a" * 10 + b"b" * (CHUNK - 10)  # the length counted them
        assert client.budget.used_bytes == 0

    run(body, write_buffer_bytes_max=CHUNK)


def test_a_cancelled_seek_does_not_drop_earlier_acknowledged_bytes() -> None:
    async def body(client: Any, meta: Any, storage: FlakyStorage) -> None:
        storage.write_gate = asyncio.Event()
        f = await client.open("/ks", "wb")
        await f.write(b"x" * CHUNK)
        await until(lambda: storage.inflight_writes == 1)
        await f.write(b"a" * 10)
        seeking = asyncio.ensure_future(f.seek(5 * CHUNK))  # sends the "a"s: waits for budget
        await until(lambda: client.budget.waits == 1)
        seeking.cancel()
        with pytest.raises(asyncio.CancelledError):
            await seeking
        storage.write_gate.set()
        await f.close()
        assert await client.cat("/ks") == b"x" * CHUNK + b"a" * 10
        assert meta.nodes["/ks"].size == CHUNK + 10

    run(body, write_buffer_bytes_max=CHUNK)
