"""An untouched write-open ends its session in the background; client.close() waits for it."""

from __future__ import annotations

import asyncio

from test_client_support import FakeMeta, make_client


def test_untouched_write_open_closes_in_background() -> None:
    async def go() -> None:
        client, meta, _ = make_client()
        gate = asyncio.Event()
        real_close = FakeMeta.close

        async def slow_close(self: FakeMeta, inode: int, session_id: int, length: int, mtime_ns: int = 0):  # type: ignore[no-untyped-def]
            await gate.wait()
            return await real_close(self, inode, session_id, length, mtime_ns)

        meta.close = slow_close.__get__(meta)  # type: ignore[method-assign]
        f = await client.open("/empty", "wb")
        await asyncio.wait_for(f.close(), 1)  # returns without waiting for meta
        assert meta.sessions and meta.closes == []
        # a file that was written still waits for its CLOSE (the length must be exact)
        g = await client.open("/data", "wb")
        await g.write(b"abc")
        closing = asyncio.ensure_future(g.close())
        await asyncio.sleep(0)
        assert not closing.done()
        gate.set()
        await closing
        await client.close()  # waits for the background CLOSE too
        assert meta.sessions == {}
        assert sorted(length for _, _, length in meta.closes) == [-1, 3]

    asyncio.run(go())
