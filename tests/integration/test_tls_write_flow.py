"""Write flow control under TLS: FrameProtocol waits for a non-empty transport buffer to drain.

asyncio's SSL transport pauses writing at size >= high (a plain one at size > high). With the
limits FrameProtocol used for both (high=0) the TLS side paused with an EMPTY buffer at
connection time; no later write resumed it, so a send waited in _drained() forever while
holding the send lock (test_fastpath_tls hung in 3 of 8 runs with eager meta handlers).
Here: real TLS over loopback, one process; no connection starts paused, and many
concurrent calls with replies of every size finish before a deadline.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from loomfs.net.auth import AuthConfig, tls_contexts
from loomfs.net.credentials import create_token
from loomfs.net.rpc import Reply, RpcClient, RpcServer
from loomfs.net.tcp import TcpTransport
from loomfs.net.transport import Address
from loomfs.testing.certs import make_cert_set
from loomfs.wire.message import Empty
from loomfs.wire.storage import STORAGE_PING

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _paused_while_empty(channels: list[Any]) -> list[Any]:
    return [ch for ch in channels
            if ch.transport is not None and ch.transport.get_write_buffer_size() == 0 and ch._write_paused]


def test_tls_connections_do_not_start_paused_and_calls_finish(tmp_path: Path) -> None:
    certs = make_cert_set(tmp_path / "certs")
    tls_server, tls_client = tls_contexts(certs.cert_file, certs.key_file, certs.ca_file)
    secret = b"s" * 32

    async def echo(req: Empty, ctx: Any) -> Reply:
        return Reply(Empty(), bytes(ctx.payload))

    async def go() -> None:
        for eager in (True, False):
            server = RpcServer("t", TcpTransport(auth=AuthConfig(secret=secret, tls_server=tls_server,
                                                                 tls_client=tls_client)), eager=eager)
            server.register(STORAGE_PING, echo)
            addr = await server.start(Address("127.0.0.1", 0))
            token = create_token(secret, uid=0, gid=0, ttl_s=600, now_s=time.time())
            client = RpcClient(TcpTransport(auth=AuthConfig(credential=token, tls_client=tls_client)))
            try:
                async with asyncio.timeout(60):
                    await client.call(addr, STORAGE_PING, Empty(), payload=b"")
                    channels = [c.channel for c in server._connections] + [
                        c.channel for c in client._conns.values()]
                    assert len(channels) == 2 and all(ch is not None for ch in channels)
                    assert _paused_while_empty(channels) == []  # the old limits paused both here
                    sizes = [0, 64, 4096, 65536, 1 << 20]
                    for _round in range(20):
                        calls = [client.call(addr, STORAGE_PING, Empty(), payload=b"x" * n) for n in sizes * 4]
                        replies = await asyncio.gather(*calls)
                        assert [len(r.payload) for r in replies] == sizes * 4
            finally:
                await client.close()
                await server.close()

    asyncio.run(go())
