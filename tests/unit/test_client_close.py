"""Write sessions: an untouched write-open ends in the background (client.close() waits for it);
open write sessions are renewed (leases)."""

from __future__ import annotations

import asyncio
import dataclasses

from test_client_support import FakeMeta, FakeStorage, make_client

from loomfs.client.core import AsyncClient
from loomfs.config import ClientConfig
from loomfs.net.buffers import BufferPool
from loomfs.wire import meta as wm


def test_untouched_write_open_closes_in_background() -> None:
    async def go() -> None:
        client, meta, _ = make_client()
        gate = asyncio.Event()
        real_close = FakeMeta.close

        async def slow_close(self: FakeMeta, inode: int, session_id: int, length: int, mtime_ns: int = 0,  # type: ignore[no-untyped-def]
                             **kw: int):
            await gate.wait()
            return await real_close(self, inode, session_id, length, mtime_ns, **kw)

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


class LeasedMeta(FakeMeta):
    """Write sessions come with a lease; renewals are recorded, and meta may have lost some."""

    def __init__(self) -> None:
        super().__init__()
        self.renewals: list[tuple[int, list[int]]] = []
        self.expired: set[int] = set()

    async def open(self, path: str, flags: int, mode: int, client_id: int, session_id: int = 0,
                   **kw: object) -> wm.OpenRsp:
        rsp = await super().open(path, flags, mode, client_id, session_id, **kw)  # type: ignore[arg-type]
        return dataclasses.replace(rsp, session_lease_s=60.0 if rsp.session_id else 0.0)

    async def renew_sessions(self, client_id: int, session_ids: list[int]) -> int:
        self.renewals.append((client_id, session_ids))
        return len([s for s in session_ids if s in self.sessions and s not in self.expired])


def test_write_sessions_are_renewed_while_open() -> None:
    async def go() -> None:
        meta = LeasedMeta()
        client = AsyncClient(meta, FakeStorage(), config=ClientConfig(), client_id=7, pool=BufferPool())
        assert await client.renew_sessions() == 0 and meta.renewals == []  # nothing open: no call
        r = await client.open("/r", "wb")
        await r.close()
        f = await client.open("/f", "xb")  # "x": created at open ("w" waits for its bytes)
        g = await client.open("/g", "xb")
        await client.open("/f", "rb")  # read opens hold no session
        task = client._renew_task
        assert task is not None and not task.done()  # started by the first write open
        assert await client.renew_sessions() == 2
        assert meta.renewals[-1] == (7, sorted([f.session_id, g.session_id]))
        meta.expired.add(g.session_id)  # this client was cut off from meta for a lease
        assert await client.renew_sessions() == 1 and client.sessions_lost_total == 1
        await g.close()
        assert await client.renew_sessions() == 1 and meta.renewals[-1] == (7, [f.session_id])
        await client.close()
        assert task.done() and client._renew_task is task

    asyncio.run(go())


def test_write_opens_name_their_session_and_leave_truncation_to_meta() -> None:
    async def go() -> None:
        storage = FakeStorage()
        meta = FakeMeta()  # cuts no chunks: meta does, the client must not (its cut could race a writer)
        client = AsyncClient(meta, storage, config=ClientConfig(), client_id=7, pool=BufferPool())
        sent: list[int] = []
        real_open = meta.open

        async def replaying_open(path: str, flags: int, mode: int, client_id: int, session_id: int = 0,
                                 **kw: object) -> wm.OpenRsp:
            sent.append(session_id)
            rsp = await real_open(path, flags, mode, client_id, session_id, **kw)  # type: ignore[arg-type]
            return dataclasses.replace(rsp, replayed=path == "/again")  # the first reply was lost

        meta.open = replaying_open  # type: ignore[method-assign]
        await client.pipe("/again", b"x" * 2500)
        assert await client.cat("/again") == b"x" * 2500  # a READ: no OPEN
        await (await client.open("/again", "rb")).close()
        assert sent[0] >> 62 == 1 and sent[1] == 0 and len(sent) == 2  # write opens name a session, reads do not
        f = await client.open("/again", "wb")  # O_TRUNC, replayed
        await f.write(b"new")
        await f.close()
        await (await client.open("/again", "ab")).close()
        assert storage.removes == [] and storage.truncates == []
        assert await client.cat("/again") == b"new"
        await client.close()

    asyncio.run(go())
