"""Reads and writes in flight while a lock's revalidation (loomfs.mount.revalidate) swaps the
client file under them, without a mount: the mount's handlers (LoomOperations) over a real
AsyncClient and real AsyncFiles, on in-memory meta and storage (no sockets). A gate on the
storage holds a READ in flight; the kernel's invalidation is recorded."""

from __future__ import annotations

import asyncio
import errno
import random
import threading
from typing import Any

import pyfuse3
import pytest
from test_client_support import CHUNK, FakeMeta, FakeStorage, make_client

from loomfs.client.core import AsyncClient
from loomfs.mount import revalidate as rv
from loomfs.mount.edge import Handle
from loomfs.mount.ops import LoomOperations
from loomfs.mount.options import MountOptions

DATA = random.Random(9).randbytes(6 * CHUNK)


@pytest.fixture(autouse=True)
def kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rv.pyfuse3, "invalidate_inode", lambda inode, attr_only: None)
    monkeypatch.setattr(rv, "ENABLED", True)


async def _setup(**config: Any) -> tuple[LoomOperations, AsyncClient, FakeMeta, FakeStorage, int]:
    client, meta, storage = make_client(**config)
    f = await client.open("/f", "wb")
    await f.write(DATA)
    await f.close()
    ops = LoomOperations(client, asyncio.get_running_loop(), MountOptions(prefetch_chunks=0))
    inode = meta.nodes["/f"].inode
    ops.inodes.remember(inode, "/f")
    return ops, client, meta, storage, inode


async def _until(cond: Any, what: str, steps: int = 50) -> None:
    for _ in range(steps):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{what}: not in {steps} loop steps")


def test_a_read_in_flight_keeps_the_swapped_out_file_open_until_it_is_done() -> None:
    """F9: a READ of a read-only descriptor waits on storage (the client's read-ahead of
    chunk 0, a sequential stream) when a lock on another descriptor is granted. The old file
    must stay open until that READ is done; then it closes with nothing left in its cache
    (closed at the swap, the READ carried on and started read-ahead into the closed file's
    emptied cache, which nothing ever waits for or gives back)."""

    async def main() -> None:
        ops, client, _meta, storage, inode = await _setup(readahead_chunks=2)
        old = await client.open("/f", "rb")
        h = Handle(inode, old, False)
        ops.handles[1] = h
        assert bytes(await ops.read(1, 0, 100)) == DATA[:100]
        storage.read_gate = asyncio.Event()
        read = asyncio.ensure_future(ops.read(1, 100, 100))  # the stream's 2nd READ: read-ahead
        await _until(lambda: storage.inflight_reads == 1, "the READ's fetch in flight")
        await rv.revalidate(ops, inode)
        assert h.file is not old and ops.stats.requests["lock_reopens"] == 1
        assert not old.closed and ops.uses.in_use(old) == 1  # the READ still has it
        storage.read_gate.set()
        assert bytes(await read) == DATA[100:200]
        await _until(lambda: old.closed, "the old file closed by its last read")
        assert len(old.cache) == 0 and ops.uses.deferred_closes == 1
        assert bytes(await ops.read(1, 200, 100)) == DATA[200:300]  # through the new file
        assert h.file.bytes_read == 100
        await ops.release(1)
        await ops.uses.drain()

    asyncio.run(main())


def test_a_file_nothing_reads_is_closed_at_the_swap() -> None:
    async def main() -> None:
        ops, client, _meta, _storage, inode = await _setup()
        old = await client.open("/f", "rb")
        ops.handles[1] = Handle(inode, old, False)
        await rv.revalidate(ops, inode)
        assert old.closed and ops.uses.deferred_closes == 0

    asyncio.run(main())


def _writer(ops: LoomOperations, client: AsyncClient, fh: int, inode: int, f: Any, lock: asyncio.Lock) -> Handle:
    h = Handle(inode, f, True, lock=lock)
    ops.handles[fh] = h
    return h


def test_a_write_waiting_for_the_file_lock_during_a_reopen_lands_in_the_new_file() -> None:
    """The grant reopens the write file while another thread of the process writes through a
    second descriptor: the WRITE waits for the file's lock and goes to the new file; its bytes
    reach meta and storage at the close."""

    async def main() -> None:
        ops, client, meta, storage, inode = await _setup()
        lock = asyncio.Lock()
        w = await client.open("/f", "r+b")
        h1 = _writer(ops, client, 1, inode, w, lock)
        _writer(ops, client, 2, inode, w, lock)
        storage.held_writes = []  # the old file's CLOSE sends its buffered bytes: held
        assert await ops.write(1, 0, b"first") == 5
        grant = asyncio.ensure_future(rv.revalidate(ops, inode))
        await _until(lambda: len(storage.held_writes or []) == 1, "the old file's bytes in flight")
        write = asyncio.ensure_future(ops.write(2, 6 * CHUNK, b"second"))  # waits for the lock
        await _until(lambda: lock._waiters is not None and len(lock._waiters) == 1, "the WRITE waiting")
        storage.held_writes[0].set_result(None)
        storage.held_writes = None
        await grant
        assert await write == 6 and h1.file is not w and w.closed
        await ops.release(1)
        await ops.release(2)
        assert meta.nodes["/f"].size == 6 * CHUNK + 6
        want = b"first" + DATA[5:] + b"second"
        assert storage.content(inode, len(want)) == want

    asyncio.run(main())


def test_a_write_waiting_during_a_reopen_that_finds_the_name_gone_answers_enoent() -> None:
    """Another node renamed the file away before the grant: the write file stays closed (its
    next use opens the name again: ENOENT). A WRITE and a READ that waited for the file's lock
    meanwhile answer that, not EINVAL (a closed client file's ValueError)."""

    async def main() -> None:
        ops, client, meta, storage, inode = await _setup()
        lock = asyncio.Lock()
        _writer(ops, client, 1, inode, await client.open("/f", "r+b"), lock)
        storage.held_writes = []
        assert await ops.write(1, 0, b"first") == 5
        meta.nodes["/g"] = meta.nodes.pop("/f")  # the other node's rename
        grant = asyncio.ensure_future(rv.revalidate(ops, inode))
        await _until(lambda: len(storage.held_writes or []) == 1, "the old file's bytes in flight")
        write = asyncio.ensure_future(ops.write(1, 0, b"x"))
        read = asyncio.ensure_future(ops.read(1, 0, 10))
        await _until(lambda: lock._waiters is not None and len(lock._waiters) == 2, "both waiting")
        storage.held_writes[0].set_result(None)
        storage.held_writes = None
        await grant
        for op in (write, read):
            with pytest.raises(pyfuse3.FUSEError) as err:
                await op
            assert err.value.errno == errno.ENOENT
        assert storage.content(inode, 5) == b"first"  # the bytes before the lock reached storage

    asyncio.run(main())


def test_with_its_own_loop_a_prefetch_fetch_started_before_the_swap_reads_the_old_file() -> None:
    """``loop=separate``: the mount's handlers on one loop, the client on another (a thread),
    as the mount runs them. A sequential READ starts its prefetch fetches; their preads reach
    the client's loop a step later, after the swap's close would have (the end of
    ``_reopen_reader``, run in the step between). The fetch must find the old file open and
    the READ answer from it; then the old file closes."""
    client_loop = asyncio.new_event_loop()
    thread = threading.Thread(target=client_loop.run_forever, daemon=True)
    thread.start()

    def on_client(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, client_loop).result(timeout=30)

    async def setup() -> tuple[AsyncClient, FakeStorage, int, Any, Any]:
        client, meta, storage = make_client()
        f = await client.open("/f", "wb")
        await f.write(DATA)
        await f.close()
        return client, storage, meta.nodes["/f"].inode, await client.open("/f", "rb"), await client.open("/f", "rb")

    async def main() -> None:
        client, storage, inode, old, new = on_client(setup())
        ops = LoomOperations(client, client_loop, MountOptions(loop="separate", prefetch_chunks=2))
        ops.inodes.remember(inode, "/f")
        h = Handle(inode, old, False, prefetch=ops._prefetcher(old))
        ops.handles[1] = h
        assert bytes(await ops.read(1, 0, 500)) == DATA[:500]  # a new stream: read directly
        reads_before = len(storage.reads)
        read = asyncio.ensure_future(ops.read(1, 500, 500))  # sequential: fetches chunks 0 and 1
        await asyncio.sleep(0)  # the READ's step: the fetch tasks made, their preads not sent yet
        assert h.prefetch is not None and len(h.prefetch._chunks) == 2
        rv._swap(ops, old, new)  # the end of _reopen_reader, in the step that follows
        await ops.uses.retire(old)
        assert bytes(await read) == DATA[500:1000]
        assert ops.stats.read_prefetched == 1  # answered from the fetched chunk, not read again
        await ops.uses.drain()  # the close its last fetch (chunk 1's) starts
        assert old.closed and ops.uses.deferred_closes == 1
        assert len(storage.reads) == reads_before + 2  # the two fetches only: no direct read
        assert bytes(await ops.read(1, 1000, 500)) == DATA[1000:1500]  # the new file, a new stream
        await ops.release(1)
        await ops.uses.drain()

    try:
        asyncio.run(main())
    finally:
        client_loop.call_soon_threadsafe(client_loop.stop)
        thread.join(timeout=30)
        client_loop.close()
