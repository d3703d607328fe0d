"""``AsyncFile.grow`` (the mount's fallocate mode 0): a length report that writes nothing, so
meta keeps the larger length, never cuts another client's longer file, and a grow from before
another client's truncate does not bring the old length back (reviews, session 13). Over the
client fakes (no sockets)."""

from __future__ import annotations

import asyncio

from test_client_support import make_client

from loomfs.wire import meta as wm


def test_grow_extends_with_zeros_and_reports_at_once() -> None:
    async def body() -> None:
        client, meta, _ = make_client()
        f = await client.open("/f", "w+b")
        await f.write(b"x" * 100)
        assert await f.grow(5000) == 5000
        assert meta.nodes["/f"].size == 5000  # reported at once, not at close
        await f.seek(0)
        assert await f.read() == b"x" * 100 + bytes(4900)
        assert await f.grow(10) == 5000  # never shorter
        await f.close()
        assert meta.nodes["/f"].size == 5000

    asyncio.run(body())


def test_grow_never_cuts_another_clients_longer_file() -> None:
    async def body() -> None:
        client, meta, _ = make_client()
        f = await client.open("/f", "w+b")
        await f.write(b"a")
        await f.flush()
        await meta.sync(f.inode, 1 << 20, trunc_epoch=0)  # another writer's report: 1 MiB
        await f.grow(4096)  # this handle thinks the file is 1 byte long
        assert meta.nodes["/f"].size == 1 << 20 and f.length == 4096  # this handle's view: not meta's
        await f.close()  # (real meta's close keeps the larger too: tests/integration/test_mount.py)

    asyncio.run(body())


def test_grow_from_before_a_foreign_truncate_does_not_bring_the_length_back() -> None:
    async def body() -> None:
        client, meta, _ = make_client()
        f = await client.open("/f", "w+b")
        await f.write(b"x" * 1000)
        await f.fsync()
        await meta.setattr(wm.SetattrReq(path="/f", size=0))  # another client truncates: epoch 1
        await f.grow(10)  # reported at epoch 0: does not grow (counts as before the truncate)
        assert meta.nodes["/f"].size == 0 and f.length == 0
        await f.close()
        assert meta.nodes["/f"].size == 0

    asyncio.run(body())


def test_grow_of_an_inline_file() -> None:
    async def body() -> None:
        client, meta, _ = make_client(inline_put_max_bytes=64 << 10)
        f = await client.open("/g", "w+b")
        await f.write(b"abc")
        await f.grow(50)
        await f.close()
        assert meta.nodes["/g"].size == 50
        g = await client.open("/g", "rb")
        assert await g.read() == b"abc" + bytes(47)
        await g.close()

    asyncio.run(body())
