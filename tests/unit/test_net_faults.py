"""The userspace network-fault hook: rules from a file, applied to new and existing connections."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

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
