"""Review of e0b923a: a failed chunk write's range after another client's truncate (the fakes
of test_client_support; no sockets, no sleeps)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_client_hunt16_writes import FlakyStorage, run

from loomfs.errors import TimedOut
from loomfs.wire.meta import SetattrReq


def test_another_clients_truncate_does_not_let_fsync_pass_over_a_failed_range_below_it() -> None:
    """A 5000-byte file; this client writes [0, 3000) over it and the write of chunk 0 fails
    (flush raises it). Another client then cuts the file to 2000: [0, 1000) is inside the
    file and holds the old bytes, not what the program wrote, and the program has not written
    it again. The fsync that learns of the truncate (its epoch) reset the written end and so
    passed, and close too: written bytes lost with success, which e0b923a means to refuse
    ("fsync/close keep failing until the program writes that range again")."""

    async def body(client: Any, meta: Any, storage: FlakyStorage) -> None:
        g = await client.open("/t", "w+b")
        await g.write(b"o" * 5000)
        await g.close()
        f = await client.open("/t", "r+b")
        storage.fail_once = {0}
        await f.write(b"n" * 3000)
        with pytest.raises(TimedOut):
            await f.flush()
        await meta.setattr(SetattrReq(path="/t", inode=f.inode, size=2000))  # another client's truncate
        with pytest.raises(OSError):
            await f.fsync()
        with pytest.raises(OSError):
            await f.close()
        assert await client.cat("/t") == b"o" * 1000 + b"n" * 1000

    run(body)


def test_a_range_written_again_after_another_clients_truncate_lets_close_pass() -> None:
    async def body(client: Any, meta: Any, storage: FlakyStorage) -> None:
        g = await client.open("/u", "w+b")
        await g.write(b"o" * 5000)
        await g.close()
        f = await client.open("/u", "r+b")
        storage.fail_once = {0}
        await f.write(b"n" * 3000)
        with pytest.raises(TimedOut):
            await f.flush()
        await meta.setattr(SetattrReq(path="/u", inode=f.inode, size=2000))
        await f.seek(0)
        await f.write(b"m" * 1000)  # the failed range again
        await f.fsync()
        await f.close()
        assert await client.cat("/u") == b"m" * 1000 + b"n" * 1000

    run(body)


def test_a_close_cancelled_during_metas_close_is_not_quietly_done_by_the_next_close() -> None:
    """``asyncio.wait_for(f.close(), t)`` times out while CLOSE waits for meta (or Ctrl-C in
    the blocking API, whose cancel stops the task): the caller is told it did not finish
    and calls close again, which finds the file closed and returns: no CLOSE carried the
    length, so the acknowledged bytes are not in the file's length (until meta's session
    expiry, if that recovers it)."""

    async def body(client: Any, meta: Any, storage: FlakyStorage) -> None:
        gate = asyncio.Event()
        entered = asyncio.Event()
        real_close = meta.close

        async def slow_close(*args: Any, **kw: Any) -> Any:
            entered.set()
            await gate.wait()
            return await real_close(*args, **kw)

        meta.close = slow_close
        f = await client.open("/c", "w+b")
        await f.write(b"x" * 1500)
        closing = asyncio.ensure_future(f.close())
        await entered.wait()
        closing.cancel()
        await asyncio.gather(closing, return_exceptions=True)
        gate.set()
        try:
            await f.close()
        except OSError:
            return  # refused: the program knows
        assert meta.nodes["/c"].size == 1500

    run(body)
