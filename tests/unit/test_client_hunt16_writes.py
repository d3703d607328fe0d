"""Hunt 16: data-loss and wrong-length cases of the client's chunk write path (AsyncFile over
the in-memory fakes of test_client_support; no sockets, no sleeps)."""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from test_client_support import CHUNK, FakeMeta, FakeStorage

from loomfs.client.core import AsyncClient
from loomfs.config import ClientConfig
from loomfs.errors import LoomError, NoSpace, TimedOut
from loomfs.net.buffers import BufferPool
from loomfs.wire.types import Layout


class FlakyStorage(FakeStorage):
    """FakeStorage whose writes of the chunks in ``fail_once`` fail the first time only (a
    write that timed out, a head that went away: the next try goes through)."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_once: set[int] = set()

    async def write_chunk(self, layout: Layout, inode: int, index: int, offset: int, data: memoryview) -> None:
        if index in self.fail_once:
            self.fail_once.discard(index)
            raise TimedOut(f"write of chunk {index} timed out")
        await super().write_chunk(layout, inode, index, offset, data)


def run(fn: Callable[..., Awaitable[Any]], **config: object) -> Any:
    async def main() -> Any:
        storage = FlakyStorage()
        meta = FakeMeta(storage=storage)
        config.setdefault("inline_put_max_bytes", 0)
        client = AsyncClient(meta, storage, config=ClientConfig(**config),  # type: ignore[arg-type]
                             client_id=7, pool=BufferPool())
        return await fn(client, meta, storage)

    return asyncio.run(main())


async def until(cond: Callable[[], bool], steps: int = 1000) -> None:
    """Yield to the loop until ``cond`` holds (no wall-clock wait)."""
    for _ in range(steps):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


def test_a_rewritten_failed_range_counts_again_in_the_length() -> None:
    """A chunk write failed once (reported by flush); the program wrote the range again, which
    went through, and closed without an error: the file must have all its bytes. The failed
    offset used to stay the cap of the reported length for good: the close succeeded and the
    file was empty."""
    data = bytes(range(256)) * 12  # 3072 bytes: chunks 0..3

    async def body(client: Any, meta: Any, storage: FlakyStorage) -> None:
        storage.fail_once = {0}
        f = await client.open("/r", "wb")
        await f.write(data)
        with pytest.raises(TimedOut):
            await f.flush()
        await f.seek(0)
        await f.write(data[:CHUNK])  # the failed chunk again
        await f.close()
        assert meta.nodes["/r"].size == len(data)
        assert await client.cat("/r") == data

    run(body)


def test_a_rewrite_after_a_failed_fsync_is_counted_by_the_next_fsync() -> None:
    async def body(client: Any, meta: Any, storage: FlakyStorage) -> None:
        storage.fail_once = {1}
        f = await client.open("/s", "wb")
        await f.write(b"a" * (3 * CHUNK))
        with pytest.raises(TimedOut):
            await f.fsync()
        await f.seek(CHUNK)
        await f.write(b"b" * CHUNK)
        await f.fsync()
        assert meta.nodes["/s"].size == 3 * CHUNK
        await f.close()
        assert await client.cat("/s") == b"a" * CHUNK + b"b" * CHUNK + b"a" * CHUNK

    run(body)


def test_a_partial_rewrite_keeps_the_rest_of_the_failed_range_out_of_the_length() -> None:
    async def body(client: Any, meta: Any, storage: FlakyStorage) -> None:
        storage.fail_once = {0}
        f = await client.open("/p", "wb")
        await f.write(b"a" * (2 * CHUNK))
        with pytest.raises(TimedOut):
            await f.flush()
        await f.seek(0)
        await f.write(b"b" * 100)  # only the first 100 bytes of the failed chunk again
        with pytest.raises(OSError) as err:
            await f.close()
        assert err.value.errno == errno.EIO
        assert meta.nodes["/p"].size == 100

    run(body)


def test_close_fails_while_acknowledged_bytes_are_left_out_of_the_length() -> None:
    """The error of a chunk write is raised once (here by the next write); the program went on
    and closed. The length stops at the failed chunk, so the bytes of every later write that
    returned are not in the file: the close must not succeed."""

    async def body(client: Any, meta: Any, storage: FlakyStorage) -> None:
        storage.fail_once = {0}
        f = await client.open("/c", "wb")
        await f.write(b"a" * CHUNK)  # chunk 0: sent in the background, fails
        await until(lambda: f._error is not None)
        with pytest.raises(TimedOut):
            await f.write(b"b" * CHUNK)  # raises the earlier write's error (and writes nothing)
        await f.write(b"c" * CHUNK)  # goes on: acknowledged
        with pytest.raises(OSError) as err:
            await f.close()
        assert err.value.errno == errno.EIO
        assert meta.nodes["/c"].size == 0

    run(body)


def test_a_truncate_below_a_failed_range_forgets_it() -> None:
    async def body(client: Any, meta: Any, storage: FlakyStorage) -> None:
        storage.fail_once = {2}
        f = await client.open("/t", "wb")
        await f.write(b"a" * (3 * CHUNK))
        with pytest.raises(TimedOut):
            await f.flush()
        await f.truncate(CHUNK)  # the failed bytes are cut away
        await f.seek(CHUNK)
        await f.write(b"b" * (3 * CHUNK))  # and written anew past them
        await f.close()
        assert meta.nodes["/t"].size == 4 * CHUNK
        assert await client.cat("/t") == b"a" * CHUNK + b"b" * (3 * CHUNK)

    run(body)


def test_errors_of_failed_writes_name_the_file_and_keep_their_errno() -> None:
    async def body(client: Any, meta: Any, storage: FlakyStorage) -> None:
        storage.fail_index_from = 1
        f = await client.open("/n", "wb")
        await f.write(b"z" * (3 * CHUNK))
        with pytest.raises(LoomError) as err:
            await f.fsync()
        assert err.value.errno == errno.ENOSPC
        with pytest.raises(OSError) as again:
            await f.close()  # still short of what was written: not a success either
        assert again.value.errno == errno.ENOSPC and isinstance(again.value, NoSpace)
        assert meta.nodes["/n"].size == CHUNK

    run(body)
