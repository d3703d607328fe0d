"""An EC file's stripe dispatch cancelled while it waits for write budget (a write under
``asyncio.wait_for``, Ctrl-C in the blocking API) keeps the stripe's buffered bytes: it
released the buffer to the pool, and bytes of writes that had returned were never sent
while the length counted them (session 16; the chunk path's fix is 9c619ad)."""

from __future__ import annotations

import asyncio

from test_ec_write_gaps import CS, FakeIO, G, K, M, make_file, settle

from loomfs.client import ec_stripe as es
from loomfs.client.ec_file import STATS
from loomfs.ec.codec import make_codec
from loomfs.net.buffers import BufferPool


class HeldBudget:
    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.waiting = asyncio.Event()

    async def acquire(self, n: int) -> None:
        self.waiting.set()
        await self.open.wait()

    def release(self, n: int) -> None:
        pass


def test_a_dispatch_cancelled_waiting_for_budget_keeps_the_stripe() -> None:
    async def main() -> None:
        pool = BufferPool()
        io = FakeIO()
        e, f = make_file(io, pool)
        budget = f._budget = HeldBudget()
        await e.write(0, memoryview(b"a" * 100), 0)  # acknowledged: in the stripe buffer
        d = asyncio.ensure_future(e.dispatch())
        await asyncio.wait_for(budget.waiting.wait(), 5)
        d.cancel()
        await asyncio.gather(d, return_exceptions=True)
        budget.open.set()
        await e.dispatch()  # the next flush or close sends it
        await settle(f)
        assert f._error is None and f.failed == []
        got = bytearray(CS)
        await es.read_range(io, make_codec(K, M), STATS, pool, 0, memoryview(got))  # type: ignore[arg-type]
        assert got[:100] == b"a" * 100, bytes(got[:16])

    asyncio.run(main())


def test_a_stripe_another_call_replaced_meanwhile_is_never_claimed() -> None:
    async def main() -> None:
        pool = BufferPool()
        io = FakeIO()
        e, f = make_file(io, pool)
        budget = f._budget = HeldBudget()
        await e.write(0, memoryview(b"a" * 100), 0)
        d = asyncio.ensure_future(e.dispatch())
        await asyncio.wait_for(budget.waiting.wait(), 5)
        await e.write(G.stripe_bytes, memoryview(b"b" * 10), 100)  # another stripe buffered meanwhile
        d.cancel()
        await asyncio.gather(d, return_exceptions=True)
        assert f.failed == [(0, 100)] and f._error is not None and f._error.errno == 5

    asyncio.run(main())
