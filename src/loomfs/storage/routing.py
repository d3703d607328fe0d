"""How a storage node sees the chain routing: the write chain and the routing source seam."""

from __future__ import annotations

from typing import Protocol

from loomfs.common.routing import Routing
from loomfs.wire.types import TargetState


def write_chain(routing: Routing, chain_id: int) -> list[int]:
    """The members writes flow through: serving ones (head first), then the syncing one (the
    write tail: it gets every update while its predecessor copies the rest)."""
    info = routing.chain(chain_id)
    out = []
    for t in info.targets:
        ti = routing.targets.get(t)
        if ti is not None and ti.state in (TargetState.SERVING, TargetState.SYNCING):
            out.append(t)
    return out


class RoutingSource(Protocol):
    async def get(self) -> Routing: ...

    async def refresh(self, min_version: int = 0) -> Routing: ...
