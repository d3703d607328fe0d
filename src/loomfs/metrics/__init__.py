"""Prometheus metrics for every LoomFS process: RPC observer, collectors, ``/metrics``."""

from loomfs.metrics.collectors import (
    ClientCollector,
    MetaCollector,
    MgmtdCollector,
    StorageCollector,
    instrument_engines,
    instrument_meta_store,
)
from loomfs.metrics.http import HttpResponse, HttpServer, http_get
from loomfs.metrics.rpc import LATENCY_BUCKETS_S, RpcMetrics
from loomfs.metrics.scrape import Scrape, histogram_quantile, parse_metrics
from loomfs.metrics.service import ServiceMetrics, start_service_metrics

__all__ = [
    "LATENCY_BUCKETS_S",
    "ClientCollector",
    "HttpResponse",
    "HttpServer",
    "MetaCollector",
    "MgmtdCollector",
    "RpcMetrics",
    "Scrape",
    "ServiceMetrics",
    "StorageCollector",
    "histogram_quantile",
    "http_get",
    "instrument_engines",
    "instrument_meta_store",
    "parse_metrics",
    "start_service_metrics",
]
