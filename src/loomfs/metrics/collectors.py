"""Collectors that read counters from service objects at scrape time (no work per request).

Each takes the live object and yields metric families when ``/metrics`` is scraped:
``StorageCollector(service, node_id)``, ``MetaCollector(store, namespace)``,
``MgmtdCollector(state)``, ``ClientCollector(client)``. Attributes that other components
add later (resync/scrub progress, store conflicts) are read with ``getattr`` so a missing
one only leaves its metric out. ``instrument_engines`` / ``instrument_meta_store`` wrap
instance methods to time disk operations and store transactions.
"""

from __future__ import annotations

import contextvars
import functools
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from loomfs.metrics.capacity import cluster_capacity
from loomfs.net.buffers import DEFAULT_POOL, BufferPool
from loomfs.wire.types import NodeKind, NodeState, TargetState

DISK_BUCKETS_S = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                  0.1, 0.25, 0.5, 1.0, 5.0)

# progress sources: name -> function returning {target_id: (done_units, total_units)}
ProgressFn = Callable[[], Mapping[int, tuple[float, float]]]


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


class StorageCollector(Collector):
    """Per-target usage and chunk counts, forwarding counters, optional recovery progress."""

    def __init__(self, service: Any, node_id: int = 0, *, progress: Mapping[str, ProgressFn] | None = None):
        self.service = service
        self.node_id = node_id
        self.progress = dict(progress or {})

    def collect(self) -> Iterable[Metric]:
        labels = ["node", "target"]
        used = GaugeMetricFamily("loomfs_storage_target_used_bytes", "bytes of chunk data", labels=labels)
        cap = GaugeMetricFamily("loomfs_storage_target_capacity_bytes", "target capacity", labels=labels)
        free = GaugeMetricFamily("loomfs_storage_target_free_bytes", "capacity - used", labels=labels)
        chunks = GaugeMetricFamily("loomfs_storage_target_chunks", "committed chunks", labels=labels)
        node = str(self.node_id)
        for tid, t in sorted(self.service.targets.items()):
            u = t.engine.usage()
            lv = [node, str(tid)]
            used.add_metric(lv, u.used_bytes)
            cap.add_metric(lv, u.capacity_bytes)
            free.add_metric(lv, max(0, u.capacity_bytes - u.used_bytes))
            chunks.add_metric(lv, u.chunk_count)
        yield from (used, cap, free, chunks)
        stats_of = getattr(self.service, "scrub_stats", None)
        if stats_of is not None:  # the scrubber's counts per target (also in `loomfs admin targets`)
            scrub = {name: CounterMetricFamily(f"loomfs_storage_scrub_{name}_chunks", doc, labels=labels)
                     for name, doc in (("checked", "chunks the scrubber checked"),
                                       ("bad", "chunks found rotten (scrub passes, reads, clients' reports)"),
                                       ("repaired", "rotten chunks repaired from other replicas"),
                                       ("rebuilt", "of the repaired: rebuilt block by block from other versions"))}
            for tid in sorted(self.service.targets):
                s = stats_of(tid)
                for name, family in scrub.items():
                    family.add_metric([node, str(tid)], getattr(s, name))
            yield from scrub.values()
        yield _counter("loomfs_storage_forwards", "updates forwarded to successors",
                       getattr(self.service, "forwards_total", 0))
        yield _counter("loomfs_storage_reforwards", "updates re-forwarded after a chain change",
                       getattr(self.service, "reforwards_total", 0))
        yield _counter("loomfs_storage_unreachable_reports", "successors reported unreachable to mgmtd",
                       getattr(self.service, "unreachable_reports_total", 0))
        yield _counter("loomfs_storage_corrupt_reads", "partial reads that failed their block CRC",
                       getattr(self.service, "corrupt_reads_total", 0))
        yield _counter("loomfs_storage_durable_commits", "commits fsynced for a durable layout",
                       sum(getattr(t.engine, "durable_commits_total", 0) for t in self.service.targets.values()))
        tags = getattr(self.service, "tags", None)
        if tags is not None:
            yield _counter("loomfs_storage_dedupe_hits", "replayed writes answered from the tag cache",
                           getattr(tags, "hits", 0))
        for kind, fn in sorted(self.progress.items()):
            done = GaugeMetricFamily(f"loomfs_storage_{kind}_done_units", f"{kind} progress: done",
                                     labels=labels)
            total = GaugeMetricFamily(f"loomfs_storage_{kind}_total_units", f"{kind} progress: total",
                                      labels=labels)
            for tid, (d, n) in sorted(fn().items()):
                done.add_metric([node, str(tid)], d)
                total.add_metric([node, str(tid)], n)
            yield done
            yield total


class MetaCollector(Collector):
    """Store commits, conflicts (when the store counts them)."""

    def __init__(self, store: Any, namespace: Any = None):
        self.store = store
        self.namespace = namespace

    def collect(self) -> Iterable[Metric]:
        yield _counter("loomfs_meta_store_commits", "committed write transactions",
                       getattr(self.store, "commits", 0))
        for attr in ("conflicts", "conflicts_total"):
            if hasattr(self.store, attr):
                yield _counter("loomfs_meta_store_conflicts", "transactions retried after a conflict",
                               getattr(self.store, attr))
                break


class MgmtdCollector(Collector):
    """Cluster view: routing version, nodes by kind/state, targets by state, resync left."""

    def __init__(self, state: Any):
        self.state = state

    def collect(self) -> Iterable[Metric]:
        r = self.state.routing()
        yield GaugeMetricFamily("loomfs_mgmtd_routing_version", "routing version", value=r.version)
        nodes = GaugeMetricFamily("loomfs_mgmtd_nodes", "nodes by kind and state", labels=["kind", "state"])
        counts: dict[tuple[str, str], int] = {}
        for n in r.nodes:
            key = (_enum_name(NodeKind, n.kind), _enum_name(NodeState, n.state))
            counts[key] = counts.get(key, 0) + 1
        for (k, s), v in sorted(counts.items()):
            nodes.add_metric([k, s], v)
        yield nodes
        targets = GaugeMetricFamily("loomfs_mgmtd_targets", "targets by state", labels=["state"])
        by_state: dict[str, int] = {s.name.lower(): 0 for s in TargetState}
        for t in r.targets:
            by_state[_enum_name(TargetState, t.state)] = by_state.get(_enum_name(TargetState, t.state), 0) + 1
        for s, v in sorted(by_state.items()):
            targets.add_metric([s], v)
        yield targets
        yield GaugeMetricFamily("loomfs_mgmtd_chains", "chains", value=len(r.chains))
        left = GaugeMetricFamily("loomfs_mgmtd_target_sync_bytes_left", "resync bytes left",
                                 labels=["target"])
        for t in r.targets:
            if getattr(t, "sync_bytes_left", 0):
                left.add_metric([str(t.target_id)], t.sync_bytes_left)
        yield left
        cap = cluster_capacity(r)
        yield GaugeMetricFamily("loomfs_mgmtd_used_bytes", "bytes used over all targets", value=cap.used_bytes)
        yield GaugeMetricFamily("loomfs_mgmtd_capacity_bytes", "capacity over all disks (each disk once)",
                                value=cap.capacity_bytes)
        yield GaugeMetricFamily("loomfs_mgmtd_disks", "disks the targets live on", value=cap.disks)
        # replaced disks (mgmtd.diskident): targets not resynced yet, and the chains whose data
        # loss an operator accepted (a counter: it only grows, and survives restarts)
        targets_by_id = getattr(self.state, "targets", {})
        yield GaugeMetricFamily("loomfs_mgmtd_blank_targets", "targets back on a replaced disk, not resynced yet",
                                value=sum(1 for t in targets_by_id.values() if getattr(t, "blank", False)))
        yield CounterMetricFamily("loomfs_mgmtd_accepted_chain_losses", "chains whose data loss an operator accepted",
                                  value=getattr(self.state, "accepted_losses", 0))


class ClientCollector(Collector):
    """Client caches and retries: read-ahead hits/misses, buffer pool hits/misses, RPC retries."""

    def __init__(self, client: Any, pool: BufferPool = DEFAULT_POOL):
        self.client = client  # an AsyncClient (or anything with the same attributes)
        self.pool = pool

    def _readahead(self) -> tuple[float, float, float]:
        c = self.client
        if hasattr(c, "readahead_hits_total"):
            return (c.readahead_hits_total, getattr(c, "readahead_misses_total", 0),
                    getattr(c, "readahead_fetches_total", 0))
        hits = misses = fetches = 0
        for f in list(getattr(c, "_open_files", ())):
            cache = getattr(f, "_cache", None)
            if cache is not None:
                hits += cache.hits
                misses += cache.misses
                fetches += cache.fetches
        return hits, misses, fetches

    def collect(self) -> Iterable[Metric]:
        hits, misses, fetches = self._readahead()
        yield _counter("loomfs_client_readahead_hits", "reads served from the read-ahead cache", hits)
        yield _counter("loomfs_client_readahead_misses", "reads that missed the read-ahead cache", misses)
        yield _counter("loomfs_client_readahead_fetches", "chunks fetched ahead", fetches)
        yield _counter("loomfs_client_buffer_pool_hits", "buffers reused from the pool", self.pool.hits)
        yield _counter("loomfs_client_buffer_pool_misses", "fresh buffers allocated", self.pool.misses)
        rpc = getattr(self.client, "rpc", None)
        if rpc is not None:
            yield _counter("loomfs_client_rpc_retries", "RPC attempts retried", rpc.retries_total)
            yield _counter("loomfs_client_rpc_attempts", "RPC attempts made", rpc.calls_total)
        storage = getattr(self.client, "storage", None)
        yield _counter("loomfs_client_storage_retries", "chunk operations retried (tail, routing)",
                       getattr(storage, "retries_total", 0))
        meta = getattr(self.client, "meta", None)
        yield _counter("loomfs_client_meta_failovers", "switches to another meta server",
                       getattr(meta, "failovers", 0))
        yield GaugeMetricFamily("loomfs_client_open_files", "files open in this client",
                                value=len(getattr(self.client, "_open_files", ())))
        caches = getattr(self.client, "caches", None)
        if caches is not None:
            yield from self._caches(caches)

    @staticmethod
    def _caches(caches: Any) -> Iterator[Metric]:
        """The client caches (``loomfs.client.consistency.ClientCaches``), labelled by cache:
        attr (attributes and negative entries), listing, data (memory), disk."""
        named = [("attr", caches.attrs), ("listing", caches.listings), ("data", caches.data),
                 ("disk", caches.disk)]
        present = [(n, c) for n, c in named if c is not None]
        fams = {
            "hits": CounterMetricFamily("loomfs_client_cache_hits", "answers served from a client cache",
                                        labels=["cache"]),
            "misses": CounterMetricFamily("loomfs_client_cache_misses", "look-ups a client cache could not answer",
                                          labels=["cache"]),
            "evictions": CounterMetricFamily("loomfs_client_cache_evictions", "entries pushed out by a bound",
                                             labels=["cache"]),
            "hit_bytes": CounterMetricFamily("loomfs_client_cache_hit_bytes", "file bytes served from a data cache",
                                             labels=["cache"]),
        }
        for name, c in present:
            for attr, fam in fams.items():
                if hasattr(c, attr):
                    fam.add_metric([name], getattr(c, attr))
        yield from fams.values()
        entries = GaugeMetricFamily("loomfs_client_cache_entries", "entries held", labels=["cache"])
        held = GaugeMetricFamily("loomfs_client_cache_bytes", "bytes held (disk: this process's estimate)",
                                 labels=["cache"])
        for name, c in present:
            if name != "disk":
                entries.add_metric([name], len(c))
            if hasattr(c, "bytes"):
                held.add_metric([name], c.bytes)
        yield from (entries, held)
        yield _counter("loomfs_client_cache_negative_hits", "ENOENT answers served from the attribute cache",
                       caches.attrs.negative_hits)
        yield _counter("loomfs_client_cache_revalidated_hits",
                       "data cache hits for a version meta had just confirmed (strict)", caches.revalidated_hits)
        if caches.disk is not None:
            d = caches.disk
            yield _counter("loomfs_client_disk_cache_corrupt", "disk cache entries that failed their checks",
                           d.corrupt)
            yield _counter("loomfs_client_disk_cache_write_bytes", "bytes written to the disk cache", d.write_bytes)
            yield _counter("loomfs_client_disk_cache_dropped", "disk cache writes dropped (queue full)", d.dropped)


def _enum_name(enum: Any, value: int) -> str:
    try:
        return str(enum(value).name.lower())
    except ValueError:
        return str(value)


# ---- instrumentation by wrapping instance methods ------------------------------------------

def instrument_engines(targets: Iterable[Any], registry: CollectorRegistry) -> Histogram:
    """Time every engine read / stage_write / commit of these ``StorageTarget``s."""
    hist = Histogram("loomfs_storage_disk_seconds", "chunk engine operation latency",
                     ["target", "op"], buckets=DISK_BUCKETS_S, registry=registry)
    for t in targets:
        engine = t.engine
        for op in ("read", "stage_write"):
            _wrap_sync(engine, op, hist.labels(str(t.target_id), op), op)
        for op in ("aread", "astage_write", "commit"):
            _wrap_async(engine, op, hist.labels(str(t.target_id), op.removeprefix("a")), op.removeprefix("a"))
    return hist


# the op an async wrapper is timing in this task: the sync call of the same op inside it (an
# ``astage_write`` that stages on the loop calls ``stage_write``) is not counted a second time
_TIMING: contextvars.ContextVar[str] = contextvars.ContextVar("loomfs_engine_op_timed", default="")


def _wrap_sync(obj: Any, name: str, child: Histogram, op: str = "") -> None:
    fn = getattr(obj, name, None)
    if fn is None or getattr(fn, "__loomfs_timed__", False):
        return

    @functools.wraps(fn)
    def timed(*a: Any, **kw: Any) -> Any:
        if op and _TIMING.get() == op:
            return fn(*a, **kw)  # inside the async form of the same op: timed there
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            child.observe(time.perf_counter() - t0)

    timed.__loomfs_timed__ = True  # type: ignore[attr-defined]
    setattr(obj, name, timed)


def _wrap_async(obj: Any, name: str, child: Histogram, op: str = "") -> None:
    fn = getattr(obj, name, None)
    if fn is None or getattr(fn, "__loomfs_timed__", False):
        return

    @functools.wraps(fn)
    async def timed(*a: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        token = _TIMING.set(op)
        try:
            return await fn(*a, **kw)
        finally:
            _TIMING.reset(token)
            child.observe(time.perf_counter() - t0)

    timed.__loomfs_timed__ = True  # type: ignore[attr-defined]
    setattr(obj, name, timed)


def instrument_meta_store(store: Any, registry: CollectorRegistry) -> Histogram:
    """Time the store's read/write transactions (lock wait included) and count failed ones."""
    hist = Histogram("loomfs_meta_txn_seconds", "metadata store transaction latency", ["kind"],
                     buckets=DISK_BUCKETS_S, registry=registry)
    from prometheus_client import Counter

    failed = Counter("loomfs_meta_txn_failed", "transactions that raised (rolled back)", ["kind"],
                     registry=registry)
    for kind in ("read", "write"):
        fn = getattr(store, kind, None)
        if fn is None or getattr(fn, "__loomfs_timed__", False):
            continue
        setattr(store, kind, _timed_txn(fn, hist.labels(kind), failed.labels(kind)))
    return hist


def _timed_txn(fn: Callable[[], Any], child: Histogram, failed: Any) -> Callable[[], Any]:
    def timed() -> _TimedTxn:
        return _TimedTxn(fn, child, failed)

    timed.__loomfs_timed__ = True  # type: ignore[attr-defined]
    return timed


class _TimedTxn:
    """One timed transaction: a plain class, not an ``@asynccontextmanager`` generator (that
    costs a generator, its frames and a ``contextlib`` wrapper per transaction on meta's hot
    path; docs/meta-cpu.md)."""

    __slots__ = ("_fn", "_cm", "_child", "_failed", "_t0")

    def __init__(self, fn: Callable[[], Any], child: Histogram, failed: Any) -> None:
        self._fn = fn  # the store's transaction factory: called at __aenter__, as the wrapped
        self._cm: Any = None  # method would have been, so its failures count as failed too
        self._child = child
        self._failed = failed
        self._t0 = 0.0

    async def __aenter__(self) -> Any:
        self._t0 = time.perf_counter()
        try:
            self._cm = self._fn()
            return await self._cm.__aenter__()
        except BaseException:
            self._failed.inc()
            self._child.observe(time.perf_counter() - self._t0)
            raise

    async def __aexit__(self, et: Any, exc: Any, tb: Any) -> bool | None:
        try:
            suppressed = await self._cm.__aexit__(et, exc, tb)
        except BaseException:
            self._failed.inc()
            raise
        else:
            if et is not None and not suppressed:
                self._failed.inc()
            return suppressed
        finally:
            self._child.observe(time.perf_counter() - self._t0)


def families(collector: Collector) -> Iterator[Metric]:
    """What ``collector`` yields now (for tests and ``loomfs top`` in-process)."""
    yield from collector.collect()
