"""The routing version and the routing snapshot mgmtd serves (no I/O): ``RoutingMixin``.

Every change clients and services must see (membership, target states, chains, tables) bumps
``version`` (``_bump``); ``routing()`` builds the ``RoutingInfo`` snapshot of the state once per
version and caches it. Reports that are not routing changes (usage, scrub, resync progress) only
drop the cache (``_routing_cache = None``): the next snapshot shows them under the same version.
A mixin of ``ClusterState`` (``mgmtd.state``), which sets the attributes declared here.
"""

from __future__ import annotations

from loomfs.mgmtd.records import ChainRecord, NodeRecord, TableRecord, TargetRecord
from loomfs.wire.types import ChainInfo, ChainTable, NodeInfo, RoutingInfo, TargetInfo


class RoutingMixin:
    version: int
    nodes: dict[int, NodeRecord]
    targets: dict[int, TargetRecord]
    chains: dict[int, ChainRecord]
    tables: dict[int, TableRecord]
    _routing_cache: RoutingInfo | None

    def routing(self) -> RoutingInfo:
        if self._routing_cache is None or self._routing_cache.version != self.version:
            self._routing_cache = RoutingInfo(
                version=self.version,
                nodes=[NodeInfo(node_id=n.node_id, kind=n.kind, host=n.host, port=n.port, state=n.state,
                                draining=n.draining, metrics_port=n.metrics_port, domain=n.domain)
                       for n in sorted(self.nodes.values(), key=lambda n: n.node_id)],
                targets=[TargetInfo(target_id=t.target_id, node_id=t.node_id, path=t.path, state=t.state,
                                    chain_id=t.chain_id, used_bytes=t.used_bytes,
                                    capacity_bytes=t.capacity_bytes, chunk_count=t.chunk_count,
                                    disk_id=t.disk_id, scrub=t.scrub, sync_chunks_left=t.sync_chunks_left, sync_bytes_left=t.sync_bytes_left,
                                    draining=self._draining(t.node_id), blank=t.blank, format_id=t.format_id)
                         for t in sorted(self.targets.values(), key=lambda t: t.target_id)],
                chains=[ChainInfo(chain_id=c.chain_id, version=c.version, targets=list(c.targets),
                                  table_id=c.table_id)
                        for c in sorted(self.chains.values(), key=lambda c: c.chain_id)],
                tables=[ChainTable(table_id=t.table_id, version=t.version, replicas=t.replicas,
                                   chain_ids=list(t.chain_ids), ec=t.ec)
                        for t in sorted(self.tables.values(), key=lambda t: t.table_id)],
            )
        return self._routing_cache

    def _draining(self, node_id: int) -> bool:
        n = self.nodes.get(node_id)
        return n is not None and n.draining

    def _bump(self) -> None:
        self.version += 1
