"""EC writes of partial stripes (client/ec_file.py) over an in-memory fragment store (no
sockets): a gap between two writes into one new stripe reads zeros, not what a pooled buffer
held before; a failed stripe write caps the length reported to meta (review, session 13)."""

from __future__ import annotations

import asyncio
import types
from typing import Any

from loomfs.client import ec_stripe as es
from loomfs.client.ec_file import STATS, EcFileIO
from loomfs.client.ec_io import FragmentUnavailable
from loomfs.client.storage_client import zero_fill
from loomfs.ec.codec import make_codec
from loomfs.ec.stripe import Geometry
from loomfs.net.buffers import BufferPool

K, M, CS = 4, 2, 4096
G = Geometry(K, M, CS)
SB = G.stripe_bytes


class FakeIO:
    """Fragments as bytes per chunk index; slots in ``down`` refuse."""

    def __init__(self) -> None:
        self.geometry = G
        self.inode = 7
        self.chunks: dict[int, bytes] = {}
        self.down_slots: set[int] = set()

    def slot(self, index: int) -> int:
        return index % G.width

    def down(self, index: int) -> bool:
        return self.slot(index) in self.down_slots

    async def write(self, index: int, data: Any, *, exact: bool = False) -> None:
        if self.down(index):
            raise FragmentUnavailable("down")
        old = self.chunks.get(index, b"")
        d = bytes(data)
        self.chunks[index] = d if exact else d + old[len(d):]

    async def remove_all(self, begin: int, end: int) -> None:
        for i in range(begin, end):
            if i in self.chunks:
                self.chunks[i] = b""

    async def read(self, index: int, offset: int, length: int, into: memoryview) -> int | None:
        into = into[:length]
        if self.down(index):
            raise FragmentUnavailable("down")
        c = self.chunks.get(index)
        if c is None:
            zero_fill(into)
            return None
        part = c[offset : offset + length]
        into[: len(part)] = part
        zero_fill(into[len(part):])
        return len(c)


class Budget:
    async def acquire(self, n: int) -> None:
        pass

    def release(self, n: int) -> None:
        pass


class FakeFile(types.SimpleNamespace):
    """What EcFileIO uses of its AsyncFile: failed ranges as ``AsyncFile`` keeps them."""

    failed: list[tuple[int, int]]

    def _note_failed(self, start: int, end: int, exc: BaseException) -> None:
        self.failed.append((start, end))

    def _note_written(self, start: int, end: int) -> None:
        self.failed = [(s, e) for a, b in self.failed for s, e in ((a, min(b, start)), (max(a, end), b)) if s < e]


def make_file(io: FakeIO, pool: BufferPool) -> tuple[EcFileIO, Any]:
    f = FakeFile(_pool=pool, _budget=Budget(), _flushes=set(), _error=None, failed=[],
                 path="/x", _config=types.SimpleNamespace(ec_ack_fragments_min=0))
    e = object.__new__(EcFileIO)
    e.file = f  # type: ignore[assignment]
    e.io = io  # type: ignore[assignment]
    e.geometry = G
    e.codec = make_codec(K, M)
    e._cur = None
    e._last = {}
    e._inflight = asyncio.Semaphore(4)
    return e, f


async def settle(f: Any) -> None:
    while f._flushes:
        await asyncio.gather(*list(f._flushes), return_exceptions=True)


def test_a_gap_between_two_writes_of_a_new_stripe_reads_zeros() -> None:
    async def main() -> None:
        pool = BufferPool()
        b = pool.acquire(es.stripe_buffer_bytes(G))
        memoryview(b)[:] = b"\xaa" * len(b)  # what an earlier user of the pooled buffer left
        pool.release(b)
        io = FakeIO()
        e, f = make_file(io, pool)
        await e.write(0, memoryview(b"a" * 100), 0)
        await e.write(CS + 10, memoryview(b"b" * 10), 100)  # the same stripe: a gap [100, CS + 10)
        await e.dispatch()
        await settle(f)
        assert f._error is None
        got = bytearray(CS + 20)
        await es.read_range(io, make_codec(K, M), STATS, pool, 0, memoryview(got))  # type: ignore[arg-type]
        assert got[:100] == b"a" * 100 and got[100 : CS + 10] == bytes(CS - 90) and got[CS + 10 :] == b"b" * 10

    asyncio.run(main())


def test_a_failed_stripe_write_caps_the_reported_length() -> None:
    async def main() -> None:
        io = FakeIO()
        e, f = make_file(io, BufferPool())
        io.down_slots = {0, 1, 2}  # more fragments down than the code can lose
        await e.write(SB + 100, memoryview(b"c" * 50), SB)
        await e.dispatch()
        await settle(f)
        assert f._error is not None and f.failed == [(SB + 100, SB + 150)]

    asyncio.run(main())
