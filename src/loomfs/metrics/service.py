"""One call per process: a registry, the RPC observer, collectors and the ``/metrics`` endpoint.

    metrics = await start_service_metrics("storage3", server, rpc, port=config.metrics_port,
                                          collectors=[StorageCollector(service, node_id)])
    ...  # metrics.port is the bound port (config 0 = an ephemeral one)
    await metrics.close()
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from loomfs.metrics.http import HttpResponse, HttpServer
from loomfs.metrics.rpc import RpcMetrics

logger = logging.getLogger(__name__)


class ServiceMetrics:
    """A process's metrics: ``registry``, ``rpc`` observer, and (once started) ``port``."""

    def __init__(self, name: str, *, collectors: Iterable[Collector] = (), process: bool = True):
        self.name = name
        self.registry = CollectorRegistry()
        self.rpc = RpcMetrics(self.registry)
        info = Gauge("loomfs_service_info", "constant 1; labels say which service this is",
                     ["service"], registry=self.registry)
        info.labels(name).set(1)
        if process:
            ProcessCollector(registry=self.registry)
        for c in collectors:
            self.registry.register(c)
        self.http: HttpServer | None = None
        self.port = 0

    def observe(self, *rpc_endpoints: Any) -> None:
        """Attach the RPC observer to RpcServer / RpcClient objects (None ones are skipped)."""
        for e in rpc_endpoints:
            if e is not None and self.rpc not in e.observers:
                e.observers.append(self.rpc)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def _page(self, query: dict[str, list[str]]) -> HttpResponse:
        return HttpResponse(self.render(), CONTENT_TYPE_LATEST)

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self.http = HttpServer({"/metrics": self._page, "/": self._page}, name=f"{self.name}-metrics")
        self.port = await self.http.start(host, port)
        logger.info("%s: metrics on http://%s:%d/metrics", self.name, host, self.port)
        return self.port

    async def close(self) -> None:
        if self.http is not None:
            await self.http.close()
            self.http = None

    def __repr__(self) -> str:
        return f"ServiceMetrics({self.name} port={self.port} {self.rpc!r})"


async def start_service_metrics(
    name: str,
    rpc_server: Any = None,
    rpc_client: Any = None,
    *,
    port: int = 0,
    host: str = "127.0.0.1",
    collectors: Iterable[Collector] = (),
) -> ServiceMetrics:
    """Create the process's metrics, observe its RPC server and client, serve ``/metrics``.

    ``port=0`` binds an ephemeral port; the bound one is ``.port`` on the result. A port
    below 0 disables the endpoint (the observer still counts)."""
    m = ServiceMetrics(name, collectors=collectors)
    m.observe(rpc_server, rpc_client)
    if port >= 0:
        await m.start(host, port)
    return m
