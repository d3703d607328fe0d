"""Asking a running local cluster how it is: mgmtd's routing, the chunks of an inode, and the
waits (for routing to satisfy a condition, a service to listen, meta to answer) that raise with
the log tail of a service that died meanwhile; ``status`` for ``loomfs local status``.

Part of ``LocalCluster`` (``testing.cluster``), on top of ``ClusterConfig``.
"""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Any

from loomfs.common.routing import MgmtdSet, parse_addresses
from loomfs.errors import LoomError
from loomfs.net.transport import Address
from loomfs.testing.cluster_config import ClusterConfig
from loomfs.testing.cluster_state import _reap
from loomfs.wire import mgmtd as wm
from loomfs.wire.types import NodeState, RoutingInfo, TargetState


class ClusterWaits(ClusterConfig):
    """mgmtd queries, waits and status of a local cluster."""

    def routing(self) -> RoutingInfo:
        async def go() -> RoutingInfo:
            rpc = self._rpc(connect_timeout_s=1.0)
            try:
                mgmtd = MgmtdSet(rpc, parse_addresses(self.mgmtd_addresses))
                rsp = await mgmtd.call(wm.GET_ROUTING, wm.GetRoutingReq(), timeout_s=2.0, retry=False)
                assert rsp.body.routing is not None
                return rsp.body.routing
            finally:
                await rpc.close()

        return _run(go())

    def chunks_of(self, inode: int) -> list[tuple[int, Any]]:
        """(target_id, ChunkMeta) for every chunk of ``inode`` on every running storage node."""
        from loomfs.wire.storage import QUERY_CHUNKS, QueryChunksReq

        routing = self.routing()
        running = {s.node_id for s in self.services.values() if s.kind == "storage" and s.alive()}
        nodes = {n.node_id: n for n in routing.nodes
                 if n.node_id in running and n.state == NodeState.ALIVE}

        async def go() -> list[tuple[int, Any]]:
            rpc = self._rpc(connect_timeout_s=1.0)
            out: list[tuple[int, Any]] = []
            try:
                for t in routing.targets:
                    n = nodes.get(t.node_id)
                    if n is None:
                        continue  # stopped or dead: nothing to ask
                    rsp = await rpc.call(Address(n.host, n.port), QUERY_CHUNKS,
                                         QueryChunksReq(target_id=t.target_id, inode=inode), timeout_s=5.0)
                    out += [(t.target_id, c) for c in rsp.body.chunks]
            finally:
                await rpc.close()
            return out

        return _run(go())

    def wait_routing(self, ok: Any, timeout_s: float, what: str) -> RoutingInfo:
        """Poll mgmtd's routing until ``ok(routing)``; raise LoomError after ``timeout_s``."""
        return self._wait(ok, timeout_s, what)

    def fully_replicated(self, r: RoutingInfo | None = None) -> bool:
        """Every chain has ``replicas`` serving targets (full redundancy)."""
        r = r or self.routing()
        states = {t.target_id: t.state for t in r.targets}
        replicas = {t.table_id: t.replicas for t in r.tables}  # an EC table's chains have one
        return bool(r.chains) and all(
            sum(1 for t in c.targets if states.get(t) == TargetState.SERVING) >= replicas.get(c.table_id, self.replicas)
            for c in r.chains
        )

    def _wait(self, ok: Any, timeout_s: float, what: str) -> RoutingInfo:
        end = time.monotonic() + timeout_s
        last: BaseException | None = None
        while time.monotonic() < end:
            self._check_crashed()
            try:
                r = self.routing()
                if ok(r):
                    return r
            except (LoomError, OSError) as exc:
                last = exc
            time.sleep(0.1)
        raise LoomError(f"timed out after {timeout_s:.0f}s waiting for {what} ({last}); logs in {self.root}")

    def _check_crashed(self) -> None:
        for s in self.services.values():
            if s.pid and not s.alive():
                _reap(s.pid)
                tail = Path(s.log_path).read_text(errors="replace")[-2000:] if Path(s.log_path).exists() else ""
                raise LoomError(f"{s.name} exited during start-up; log tail:\n{tail}")

    def wait_listening(self, name: str, timeout_s: float = 30.0) -> None:
        s = self.services[name]
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if not s.alive():
                self._check_crashed()
            try:
                with socket.create_connection(("127.0.0.1", s.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise LoomError(f"{name} is not listening on {s.address} after {timeout_s:.0f}s")

    def _ensure_chain_table(self, timeout_s: float) -> None:
        r = self.routing()
        if r.tables:
            ec_table = max(r.tables, key=lambda t: t.table_id)
            if self.ec_targets_per_node and len(r.tables) >= 2 and not any(t.ec for t in r.tables) \
                    and ec_table.replicas == 1:
                # a cluster directory from before tables said they are EC (routing shows no
                # table flagged ec): its EC table, the second one made below, is marked again
                self._mark_ec(ec_table.table_id, timeout_s)
            return

        async def go() -> None:
            rpc = self._rpc()
            try:
                ec = self.ec_targets_per_node
                mgmtd = MgmtdSet(rpc, parse_addresses(self.mgmtd_addresses))
                await mgmtd.call(wm.CREATE_CHAIN_TABLE,
                                 wm.CreateChainTableReq(replicas=self.replicas,
                                                        targets_per_node=self.targets_per_node if ec else 0),
                                 timeout_s=timeout_s)
                if ec:
                    await mgmtd.call(wm.CREATE_CHAIN_TABLE,
                                     wm.CreateChainTableReq(replicas=1, targets_per_node=ec, ec=True),
                                     timeout_s=timeout_s)
            finally:
                await rpc.close()

        _run(go())

    def _mark_ec(self, table_id: int, timeout_s: float) -> None:
        async def go() -> None:
            rpc = self._rpc()
            try:
                mgmtd = MgmtdSet(rpc, parse_addresses(self.mgmtd_addresses))
                await mgmtd.call(wm.SET_TABLE_EC, wm.SetTableEcReq(table_id=table_id, ec=True, confirm=True),
                                 timeout_s=timeout_s)
            finally:
                await rpc.close()

        _run(go())

    def _wait_ping_meta(self, timeout_s: float) -> None:
        from loomfs.wire.message import Empty
        from loomfs.wire.meta import META_PING

        async def go() -> None:
            rpc = self._rpc(connect_timeout_s=1.0)
            end = time.monotonic() + timeout_s
            try:
                for s in self.services.values():
                    if s.kind != "meta":
                        continue
                    while True:
                        try:
                            await rpc.call(Address.parse(s.address), META_PING, Empty(), timeout_s=2.0,
                                           retry=False)
                            break
                        except (LoomError, OSError):
                            if time.monotonic() > end:
                                raise
                            await asyncio.sleep(0.1)
            finally:
                await rpc.close()

        _run(go())

    def status(self) -> list[dict[str, Any]]:
        if not self.services and self.state_path.exists():
            self._load_state()
        metrics: dict[tuple[str, int], int] = {}
        try:
            metrics = {(n.host, n.port): n.metrics_port for n in self.routing().nodes}
        except (LoomError, OSError):
            pass  # mgmtd down: no metrics ports to show
        out = []
        for s in self.services.values():
            alive = s.alive()
            mport = self.mgmtd_metrics_port if s.name == "mgmtd" else metrics.get(("127.0.0.1", s.port), 0)
            out.append({"name": s.name, "kind": s.kind, "pid": s.pid if alive else 0,
                        "address": s.address, "state": "running" if alive else "stopped",
                        "metrics": f"http://127.0.0.1:{mport}/metrics" if alive and mport else "",
                        "log": s.log_path})
        return out


def _run(coro: Any) -> Any:
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()
