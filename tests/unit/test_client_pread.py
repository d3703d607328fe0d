"""AsyncFile.pread's read-ahead switch over the in-memory fakes (no sockets, no sleeps)."""

from __future__ import annotations

import asyncio
import random

from test_client_support import CHUNK, make_client


def test_preads_that_continue_each_other_skip_read_ahead_when_asked() -> None:
    data = random.Random(5).randbytes(8 * CHUNK)

    async def main() -> None:
        client, meta, storage = make_client(readahead_chunks=4)
        await client.pipe("/p", data)
        f = await client.open("/p", "rb")
        piece = CHUNK // 4
        for readahead, want_cached in ((False, False), (True, True)):
            storage.reads.clear()
            for off in range(0, 2 * CHUNK, piece):  # each continues the previous one
                buf = bytearray(piece)
                assert await f.pread(off, memoryview(buf), readahead=readahead) == piece
                assert bytes(buf) == data[off : off + piece]
            whole = [r for r in storage.reads if r[2] == 0 and r[3] == CHUNK]
            assert bool(whole) is want_cached, (readahead, storage.reads)
            if not readahead:  # only the bytes asked for, nothing staged
                assert all(r[3] == piece for r in storage.reads) and len(f.cache) == 0
        await f.close()

    asyncio.run(main())
