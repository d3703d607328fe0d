"""The userspace network-fault hook: rules from a file, applied to new and existing connections."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from loomfs.errors import ConnectionFailed, LoomError, TimedOut
from loomfs.net.faults import FaultRules, FaultyTransport, Rule, parse_rules, write_rules
from loomfs.net.rpc import CallContext, RpcClient, RpcServer, handles
from loomfs.net.tcp import TcpTransport
from loomfs.net.transport import Address
from loomfs.wire.message import Empty
from loomfs.wire.storage import STORAGE_PING


class _Pinger:
    @handles(STORAGE_PING)
    async def ping(self, req: Empty, ctx: CallContext) -> Empty:
        return Empty()


def test_parse_rules_rejects_unknown_actions() -> None:
    assert parse_rules("") == []
    assert parse_rules('{"rules": [{"to": "1.2.3.4:5", "action": "delay", "delay_ms": 3}]}') == [
        Rule("1.2.3.4:5", "delay", 3.0)]
    with pytest.raises(ValueError):
        parse_rules('{"rules": [{"to": "*", "action": "explode"}]}')


@pytest.mark.timeout(30)
def test_blackhole_reset_delay_and_heal(tmp_path: Path) -> None:
    rules_file = tmp_path / "faults.json"

    async def main() -> None:
        server = RpcServer("t", TcpTransport())
        server.add_service(_Pinger())
        addr = await server.start(Address("127.0.0.1", 0))
        rpc = RpcClient(FaultyTransport(TcpTransport(), FaultRules(rules_file)), connect_timeout_s=0.5)
        try:
            await rpc.call(addr, STORAGE_PING, Empty(), timeout_s=1.0)  # no rules file: plain TCP
            # blackhole: the existing connection goes silent (requests and replies vanish)
            write_rules(rules_file, [Rule(str(addr), "blackhole")])
            await asyncio.sleep(0.15)
            t0 = time.monotonic()
            with pytest.raises(TimedOut):
                await rpc.call(addr, STORAGE_PING, Empty(), timeout_s=0.3, retry=False)
            assert time.monotonic() - t0 >= 0.29
            # a rule for another address does not matter
            write_rules(rules_file, [Rule("127.0.0.1:1", "blackhole")])
            await asyncio.sleep(0.15)
            await rpc.call(addr, STORAGE_PING, Empty(), timeout_s=1.0)
            # reset: the connection is cut and new connects are refused
            write_rules(rules_file, [Rule("*", "reset")])
            await asyncio.sleep(0.15)
            with pytest.raises(LoomError):
                await rpc.call(addr, STORAGE_PING, Empty(), timeout_s=1.0, retry=False)
            with pytest.raises(ConnectionFailed):
                await rpc.call(addr, STORAGE_PING, Empty(), timeout_s=1.0, retry=False)
            # delay
            write_rules(rules_file, [Rule(str(addr), "delay", 100.0)])
            await asyncio.sleep(0.15)
            t0 = time.monotonic()
            await rpc.call(addr, STORAGE_PING, Empty(), timeout_s=2.0)
            assert time.monotonic() - t0 >= 0.09
            # healed
            write_rules(rules_file, [])
            await asyncio.sleep(0.15)
            t0 = time.monotonic()
            await rpc.call(addr, STORAGE_PING, Empty(), timeout_s=1.0)
            assert time.monotonic() - t0 < 0.09
        finally:
            await rpc.close()
            await server.close()

    asyncio.run(main())


@pytest.mark.parametrize("case", ["scatter", "late"])
def test_a_payload_whose_frame_a_blackhole_dropped_leaves_nothing_for_the_next(case: str) -> None:
    """A blackhole lets ``payload_buffer`` through and drops ``frame_received``: the state the
    connection set for that payload (a call's Scatter, or a pooled scratch for a late reply)
    must not apply to the next frame (it came back marked scattered, or empty)."""
    from loomfs.net.faults import _FaultySink
    from loomfs.net.rpc_client import ClientConnection, _Pending
    from loomfs.net.scatter import Scatter
    from loomfs.wire import frame as fr

    def header(rid: int) -> fr.Header:
        return fr.Header(1, 2, rid, 1000, 0, "", b"", 0, 0)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        addr = Address("127.0.0.1", 1)
        conn = ClientConnection(addr)
        rules = FaultRules(Path("/nonexistent/faults.json"))
        sink = _FaultySink(conn, rules, addr)
        first: asyncio.Future[Any] = loop.create_future()
        second: asyncio.Future[Any] = loop.create_future()
        if case == "scatter":
            conn._pending[1] = _Pending(first, Scatter([memoryview(bytearray(8))]))
        conn._pending[2] = _Pending(second, None)
        rules._rules = [Rule(str(addr), "blackhole")]
        rules._reload = lambda: None  # type: ignore[method-assign]
        buf = sink.payload_buffer(fr.KIND_RESPONSE, header(1), 8)  # reply 1 arrives ...
        assert buf is not None
        sink.frame_received(fr.KIND_RESPONSE, header(1), memoryview(bytearray(8)), True)  # ... dropped
        rules._rules = []
        dest = sink.payload_buffer(fr.KIND_RESPONSE, header(2), 8)
        assert isinstance(dest, memoryview)
        dest[:] = b"REALDATA"
        sink.frame_received(fr.KIND_RESPONSE, header(2), dest, True)
        _, payload, crc_ok = second.result()
        assert bytes(payload) == b"REALDATA" and crc_ok
        assert not first.done()

    asyncio.run(main())
