"""Reading ``/metrics`` back: parse the text format, sum samples, quantiles, rates.

Pure functions over parsed scrapes, shared by ``loomfs top``, the dashboard and tests.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from loomfs.metrics.http import http_get

Labels = dict[str, str]

# storage methods that move chunk data (IOPS counts these)
DATA_METHODS = frozenset({"read", "write"})


@dataclass
class Scrape:
    """One scrape: sample name -> [(labels, value)]."""

    samples: dict[str, list[tuple[Labels, float]]] = field(default_factory=dict)
    at_s: float = 0.0  # monotonic time of the scrape

    def total(self, name: str, **match: str) -> float:
        return sum(v for lab, v in self.samples.get(name, ()) if _matches(lab, match))

    def values(self, name: str, **match: str) -> list[tuple[Labels, float]]:
        return [(lab, v) for lab, v in self.samples.get(name, ()) if _matches(lab, match)]

    def buckets(self, name: str, **match: str) -> list[tuple[float, float]]:
        """Cumulative histogram buckets ``[(le, count)]`` summed over all other labels."""
        acc: dict[float, float] = {}
        for lab, v in self.samples.get(f"{name}_bucket", ()):
            if _matches(lab, match):
                le = float(lab["le"])
                acc[le] = acc.get(le, 0.0) + v
        return sorted(acc.items())

    def __repr__(self) -> str:
        return f"Scrape(names={len(self.samples)} at={self.at_s:.1f})"


def _matches(labels: Labels, match: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in match.items())


def parse_metrics(text: str, at_s: float = 0.0) -> Scrape:
    out: dict[str, list[tuple[Labels, float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return Scrape(out, at_s)


async def scrape(host: str, port: int, *, at_s: float = 0.0, timeout_s: float = 2.0) -> Scrape:
    body = await http_get(host, port, "/metrics", timeout_s=timeout_s)
    return parse_metrics(body.decode("utf-8", "replace"), at_s)


def histogram_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float:
    """Prometheus' ``histogram_quantile``: linear interpolation inside the bucket holding the
    q-th observation. ``buckets`` are cumulative ``(le, count)``; NaN when empty."""
    bs = sorted(buckets)
    if not bs or bs[-1][1] <= 0:
        return math.nan
    total = bs[-1][1]
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le, count in bs:
        if count >= rank:
            if math.isinf(le):
                return prev_le  # beyond the last finite bound: report that bound
            in_bucket = count - prev_count
            if in_bucket <= 0:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / in_bucket
        prev_le, prev_count = le, count
    return bs[-1][0]


def delta_buckets(prev: list[tuple[float, float]], cur: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Buckets of the observations made between two scrapes (a counter reset counts from 0)."""
    p = dict(prev)
    d = [(le, c - p.get(le, 0.0)) for le, c in cur]
    if any(c < 0 for _, c in d):
        return list(cur)
    return d


@dataclass(frozen=True, slots=True)
class Rates:
    """What one process did per second between two scrapes (server side of its RPCs)."""

    ops_per_s: float = 0.0
    iops: float = 0.0  # chunk reads + writes
    bytes_in_per_s: float = 0.0
    bytes_out_per_s: float = 0.0
    errors_per_s: float = 0.0
    p50_s: float = math.nan
    p99_s: float = math.nan


def rates(prev: Scrape | None, cur: Scrape, *, side: str = "server") -> Rates:
    """Per-second rates between ``prev`` and ``cur`` (``prev`` None: zero rates, lifetime p99)."""
    lat = cur.buckets("loomfs_rpc_latency_seconds", side=side)
    if prev is None or cur.at_s <= prev.at_s:
        return Rates(p50_s=histogram_quantile(0.5, lat), p99_s=histogram_quantile(0.99, lat))
    dt = cur.at_s - prev.at_s

    def r(name: str, **match: str) -> float:
        return max(0.0, (cur.total(name, **match) - prev.total(name, **match)) / dt)

    iops = sum(r("loomfs_rpc_calls_total", side=side, method=m) for m in DATA_METHODS)
    window = delta_buckets(prev.buckets("loomfs_rpc_latency_seconds", side=side), lat)
    return Rates(
        ops_per_s=r("loomfs_rpc_calls_total", side=side),
        iops=iops,
        bytes_in_per_s=r("loomfs_rpc_payload_bytes_total", side=side, direction="in"),
        bytes_out_per_s=r("loomfs_rpc_payload_bytes_total", side=side, direction="out"),
        errors_per_s=r("loomfs_rpc_errors_total", side=side),
        p50_s=histogram_quantile(0.5, window),
        p99_s=histogram_quantile(0.99, window),
    )


def method_rates(prev: Scrape | None, cur: Scrape, *, side: str = "server") -> dict[str, float]:
    """Calls per second by method (e.g. meta ops by type)."""
    out: dict[str, float] = {}
    if prev is None or cur.at_s <= prev.at_s:
        return out
    dt = cur.at_s - prev.at_s
    for lab, v in cur.values("loomfs_rpc_calls_total", side=side):
        m = lab.get("method", "?")
        out[m] = out.get(m, 0.0) + v
    for lab, v in prev.values("loomfs_rpc_calls_total", side=side):
        m = lab.get("method", "?")
        out[m] = out.get(m, 0.0) - v
    return {m: max(0.0, v / dt) for m, v in sorted(out.items()) if v > 0}
