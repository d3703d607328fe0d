"""One call per process: a registry, the RPC observer, collectors and the ``/metrics`` endpoint.

    metrics = await start_service_metrics("storage3", server, rpc, port=config.metrics_port,
                                          collectors=[StorageCollector(service, node_id)])
    ...  # metrics.port is the bound port (config 0 = an ephemeral one)
    await metrics.close()

The endpoint is prometheus_client's own server (``start_http_server``: a WSGI server on a
daemon thread, with the library's content negotiation, OpenMetrics, gzip and ``name[]``
filters). The collectors read service state that the event loop changes, so a scrape
collects on the loop (``LoopRegistry``: the server thread waits for it), never beside it.
Why this and not our own asyncio server: docs/decisions.md, "/metrics server".
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterable, Iterator
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Gauge, start_http_server
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from loomfs.metrics.rpc import RpcMetrics

logger = logging.getLogger(__name__)

COLLECT_TIMEOUT_S = 10.0  # a scrape waits this long for the event loop, then fails (HTTP 500)


class LoopRegistry(Collector):
    """``registry`` collected on ``loop``'s thread, for a server thread that scrapes it."""

    def __init__(self, registry: CollectorRegistry, loop: asyncio.AbstractEventLoop):
        self.registry = registry
        self.loop = loop
        self._loop_thread = threading.get_ident()

    def collect(self) -> Iterator[Metric]:
        if threading.get_ident() == self._loop_thread:
            return iter(list(self.registry.collect()))

        async def on_loop() -> list[Metric]:
            return list(self.registry.collect())

        fut = asyncio.run_coroutine_threadsafe(on_loop(), self.loop)
        return iter(fut.result(COLLECT_TIMEOUT_S))

    def restricted_registry(self, names: Iterable[str]) -> Collector:
        """``/metrics?name[]=...`` (prometheus_client's filter): only samples of these names.
        Filtered after collecting (our collectors do not ``describe`` their names upfront)."""
        return _Restricted(self, frozenset(names))


class _Restricted(Collector):
    def __init__(self, parent: Collector, names: frozenset[str]):
        self.parent, self.names = parent, names

    def collect(self) -> Iterator[Metric]:
        for m in self.parent.collect():
            samples = [x for x in m.samples if x.name in self.names]
            if samples:
                out = Metric(m.name, m.documentation, m.type, m.unit)
                out.samples = samples
                yield out


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
        self.http: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    def observe(self, *rpc_endpoints: Any) -> None:
        """Attach the RPC observer to RpcServer / RpcClient objects (None ones are skipped)."""
        for e in rpc_endpoints:
            if e is not None and self.rpc not in e.observers:
                e.observers.append(self.rpc)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Serve ``/metrics`` with prometheus_client's server (its own thread); returns the
        bound port. Called on the service's event loop, where scrapes then collect."""
        loop = asyncio.get_running_loop()
        self.http, self._thread = start_http_server(port, addr=host, registry=LoopRegistry(self.registry, loop))
        self.port = int(self.http.server_port)
        logger.info("%s: metrics on http://%s:%d/metrics", self.name, host, self.port)
        return self.port

    async def close(self) -> None:
        """Stop the server thread (its shutdown waits for a scrape in progress, which may be
        waiting for this loop: so off the loop) and close its socket."""
        http, thread = self.http, self._thread
        self.http = self._thread = None
        if http is not None:
            await asyncio.to_thread(http.shutdown)
            http.server_close()
        if thread is not None:
            await asyncio.to_thread(thread.join, COLLECT_TIMEOUT_S)

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
