"""MetaClient: how many times a call whose connection broke is re-sent (no sockets)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from loomfs.client import meta_client
from loomfs.client.meta_client import MetaClient
from loomfs.common.retry import Backoff
from loomfs.common.routing import Routing
from loomfs.errors import ConnectionFailed
from loomfs.net.rpc import Response
from loomfs.wire import meta as wm
from loomfs.wire.message import Method
from loomfs.wire.types import Attr, NodeInfo, NodeKind, RoutingInfo


class OneMeta:
    def __init__(self) -> None:
        self.routing = Routing(RoutingInfo(version=1, nodes=[NodeInfo(node_id=1, kind=NodeKind.META,
                                                                      host="10.0.0.1", port=1)]))

    async def get(self) -> Routing:
        return self.routing

    async def refresh(self, min_version: int = 0) -> Routing:
        return self.routing


class BrokenRpc:
    """Breaks the first ``breaks`` calls mid-flight (a meta killed under them)."""

    def __init__(self, breaks: int) -> None:
        self.breaks = breaks
        self.calls: list[Any] = []

    async def call(self, address: Any, m: Method, req: Any, **kw: Any) -> Any:
        self.calls.append(req)
        if len(self.calls) <= self.breaks:
            raise ConnectionFailed(f"connection to {address} lost")
        return Response(body=wm.OpenRsp(attr=Attr(inode=5), session_id=req.session_id), payload=memoryview(b""))


def _client(breaks: int) -> tuple[MetaClient, BrokenRpc]:
    rpc = BrokenRpc(breaks)
    return MetaClient(rpc, OneMeta()), rpc  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def _no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(meta_client, "RESEND_BACKOFF", Backoff(0.0, 0.0))


def test_open_naming_its_session_is_resent_until_it_gets_through() -> None:
    mc, rpc = _client(breaks=meta_client.RESEND_ROUNDS - 1)
    rsp = asyncio.run(mc.open("/f", os.O_WRONLY | os.O_CREAT, 0o644, 7, session_id=99))
    assert rsp.session_id == 99 and len(rpc.calls) == meta_client.RESEND_ROUNDS
    assert {r.session_id for r in rpc.calls} == {99}  # every re-send names the same session


def test_open_without_a_session_id_is_resent_once() -> None:
    mc, rpc = _client(breaks=2)
    with pytest.raises(ConnectionFailed):
        asyncio.run(mc.open("/f", os.O_WRONLY | os.O_CREAT, 0o644, 7))
    assert len(rpc.calls) == 2
    mc, rpc = _client(breaks=2)  # a plain read open changes nothing: safe to re-send
    assert asyncio.run(mc.open("/f", os.O_RDONLY, 0o644, 7)).attr.inode == 5 and len(rpc.calls) == 3
