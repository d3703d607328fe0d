"""Rounds into rows: medians, ranges, per-round ratios and the paired comparison.

Every round measures the raw limits again and then runs each target once (LoomFS, then the
``--compare`` directory), so a noisy minute hits both sides and the limit it is held
against. A row's ``ratio`` is the median of the per-round ``value / limit`` (each round's
figure over that round's limit), not a ratio of medians; the comparison's ``paired`` ratio is
the median of per-round LoomFS/other. ``ratio_hb`` and the paired ratio point one way:
higher is better (a time is turned around: limit / value); ``us_per_op`` is shown apart.
"""

from __future__ import annotations

import statistics
from typing import Any

from loomfs.bench.workloads import Result

LOWER_BETTER_UNITS = frozenset({"s", "us/op"})  # a figure where less is better (a time)
OP_UNITS = frozenset({"ops/s", "files/s", "IOPS", "entries/s", "samples/s", "lookups/s"})


def higher_is_better(unit: str) -> bool:
    return unit not in LOWER_BETTER_UNITS


def ratio_hb(value: float, other: float, unit: str) -> float | None:
    """``value`` against ``other`` (a limit, or the comparison's figure), >1 meaning better."""
    if not value or not other:
        return None
    return value / other if higher_is_better(unit) else other / value


def _spread(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def summarize(target: str, rounds: list[list[Result]]) -> list[dict[str, Any]]:
    """One JSON row per workload of ``target`` from its rounds (same workloads every round;
    a row missing from a later round is summarised over the rounds that have it)."""
    by_round = [{r.name: r for r in rnd} for rnd in rounds]
    rows: list[dict[str, Any]] = []
    for first in rounds[0]:
        got = [b[first.name] for b in by_round if first.name in b]
        vals = [r.value for r in got]
        lim_vals = [r.limit_value for r in got]
        ratios = [r.value / r.limit_value for r in got if r.limit_value]
        hbs = [x for r in got if (x := ratio_hb(r.value, r.limit_value, r.unit)) is not None]
        s = _spread(vals)
        row: dict[str, Any] = {
            "name": first.name, "target": target, "value": s["median"], "unit": first.unit,
            "min": s["min"], "max": s["max"], "values": vals,
            "limit_name": first.limit_name, "limit_value": statistics.median(lim_vals) if lim_vals else 0.0,
            "limit_values": lim_vals,
            "ratio": statistics.median(ratios) if ratios else None, "ratios": ratios,
            "ratio_hb": statistics.median(hbs) if hbs else None,
            "ratio_hb_range": [min(hbs), max(hbs)] if hbs else None,
            "higher_is_better": higher_is_better(first.unit),
            "us_per_op": 1e6 / s["median"] if first.unit in OP_UNITS and s["median"] else None,
            "extra": {**first.extra, "values": vals},
        }
        rows.append(row)
    return rows


def pair(main_rows: list[dict[str, Any]], other_rows: list[dict[str, Any]], other: str) -> None:
    """Add ``paired`` to each row of ``main_rows`` that ``other_rows`` has: the per-round
    ratio main/other (higher is better), its median and range."""
    others = {r["name"]: r for r in other_rows}
    for r in main_rows:
        o = others.get(r["name"])
        if o is None:
            continue
        per = [x for a, b in zip(r["values"], o["values"], strict=False)
               if (x := ratio_hb(a, b, r["unit"])) is not None]
        if per:
            r["paired"] = {"target": other, "ratios": per, **_spread(per)}


def median_limits(per_round: list[dict[str, float]]) -> dict[str, float]:
    keys = per_round[0].keys()
    return {k: statistics.median(d[k] for d in per_round if k in d) for k in keys}
