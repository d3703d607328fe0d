"""A routing source tests set by hand (the storage service's ``RoutingSource`` seam)."""

from __future__ import annotations

from loomfs.common.routing import Routing
from loomfs.wire.types import RoutingInfo


class StaticRouting:
    """A routing source tests set by hand."""

    def __init__(self, info: RoutingInfo):
        self.routing = Routing(info)

    def set(self, info: RoutingInfo) -> None:
        self.routing = Routing(info)

    async def get(self) -> Routing:
        return self.routing

    async def refresh(self, min_version: int = 0) -> Routing:
        return self.routing

    def __repr__(self) -> str:
        return f"StaticRouting(v{self.routing.version})"
