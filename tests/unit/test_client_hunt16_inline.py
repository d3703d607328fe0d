"""Hunt 16: an inline file's writes while its unsent writes are on their way to meta (a flush
from another thread or task, a read at the end) are not lost when meta answers that the file
is in chunks now (another client moved it there)."""

from __future__ import annotations

import asyncio
import os

from test_client_hunt16_writes import until
from test_client_support import CHAINS, CHUNK, FakeMeta, FakeStorage

from loomfs.client.file import AsyncFile
from loomfs.client.writeback import ByteBudget
from loomfs.config import ClientConfig
from loomfs.net.buffers import BufferPool
from loomfs.wire import meta as wm
from loomfs.wire.types import Attr, FileType, Layout

INODE = 50


class MovedMeta(FakeMeta):
    """WRITE_INLINE waits for ``gate``, then answers that the file is in chunks now."""

    def __init__(self, storage: FakeStorage) -> None:
        super().__init__(storage=storage)
        self.gate = asyncio.Event()
        self.inline_writes = 0

    async def write_inline(self, inode: int, session_id: int, patches: list[wm.InlinePatch], crc: int, *,
                           close: bool = False) -> wm.InlineWriteRsp:
        self.inline_writes += 1
        await self.gate.wait()
        attr = self.nodes["/i"]
        return wm.InlineWriteRsp(attr=attr, applied=False, trunc_epoch=0)


def test_writes_during_an_inline_flush_that_meets_a_migrated_file_are_kept() -> None:
    async def main() -> None:
        storage = FakeStorage()
        meta = MovedMeta(storage)
        layout = Layout(chunk_size=CHUNK, chains=list(CHAINS), inline_max_bytes=4096)
        attr = Attr(inode=INODE, type=FileType.FILE, mode=0o644, size=0, inline=True, layout=layout)
        meta.nodes["/i"] = attr
        meta.sessions[100] = INODE
        f = AsyncFile(path="/i", attr=attr, flags=os.O_RDWR, session_id=100, storage=storage, meta=meta,
                      config=ClientConfig(), pool=BufferPool(), budget=ByteBudget(1 << 20), inline_data=b"")
        assert f.inline
        await f.write(b"a" * 10)
        flushing = asyncio.ensure_future(f.flush())  # e.g. LoomFile.flush from another thread
        await until(lambda: meta.inline_writes == 1)
        writing = asyncio.ensure_future(f.write(b"b" * 10))  # an inline patch (or after the flush)
        for _ in range(20):
            await asyncio.sleep(0)
        meta.gate.set()
        await asyncio.gather(flushing, writing)
        await f.close()
        assert meta.nodes["/i"].size == 20
        assert storage.content(INODE, 20) == b"a" * 10 + b"b" * 10

    asyncio.run(main())
