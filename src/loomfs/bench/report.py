"""Printing and plotting a bench document (the JSON ``suite.run_bench`` returns)."""

from __future__ import annotations

from typing import Any

from loomfs.bench import checkpoint, dataloader, kvcache
from loomfs.bench.smallfiles import target_check
from loomfs.cli.common import human_bytes


def fmt_value(value: float, unit: str) -> str:
    if unit == "B/s":
        return f"{human_bytes(value)}/s"
    if unit == "us/op":
        return f"{value:,.1f} us"
    if unit == "s":
        return f"{value:,.3f} s"
    return f"{value:,.0f} {unit}"


def mib_per_s(mb_per_s: float) -> float:
    """The groups' ``MBps`` extras (10^6 bytes/s) in binary units, as every figure is printed."""
    return mb_per_s * 1e6 / (1 << 20)


def fmt_ratio(ratio: float | None) -> str:
    if ratio is None:
        return "-"
    return f"{ratio:.3f}" if ratio < 0.1 else f"{ratio:.2f}"


def _legend(ax: Any) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def limit_lines(lim: dict[str, float]) -> list[str]:
    """The raw limits measured (a run of only some groups measures only what they need)."""
    lines = []
    if "loopback_tcp_Bps" in lim:
        lines.append(f"raw loopback TCP: {human_bytes(lim['loopback_tcp_Bps'])}/s one stream, "
                     f"{human_bytes(lim['loopback_tcp_2streams_Bps'])}/s two streams")
    rtt = [f"{lim['round_trips_per_s']:,.0f}/s one pair"]
    if "round_trips_2pairs_per_s" in lim:
        rtt.append(f"{lim['round_trips_2pairs_per_s']:,.0f}/s two pairs")
    if "round_trips_pinned_per_s" in lim:
        rtt.append(f"{lim['round_trips_pinned_per_s']:,.0f}/s one pair pinned to one CPU (64 B)")
    lines.append("raw loopback round trips: " + ", ".join(rtt))
    if "disk_write_Bps" in lim:
        lines.append(f"local disk: O_DIRECT 4 MiB files write {human_bytes(lim['disk_write_Bps'])}/s, read "
                     f"{human_bytes(lim['disk_read_Bps'])}/s; fsync'd file write "
                     f"{human_bytes(lim['disk_fsync_write_Bps'])}/s, read {human_bytes(lim['disk_fsync_read_Bps'])}/s; "
                     f"memcpy {human_bytes(lim['memcpy_Bps'])}/s")
    return lines


def cold_lines(doc: dict[str, Any], tgt: str, what: str) -> list[str]:
    """What a group's cold phases (``target.cold``) emptied and what stayed warm."""
    c = (doc.get("cold_caches") or {}).get(tgt)
    if not c:
        return []
    return [f"  {what}: dropped " + "; ".join(c.get("dropped", [])),
            "  not dropped: " + "; ".join(c.get("kept", []))]


def smallfile_lines(doc: dict[str, Any]) -> list[str]:
    """The small-file rows of each target next to issue 16's targets (information only)."""
    lines: list[str] = []
    for tgt in doc["targets"]:
        rows = {r["name"]: r for r in doc["results"] if r["target"] == tgt and r["name"].startswith("sf_")}
        if not rows:
            continue
        lines += ["", f"small files vs the issue 16 targets ({tgt}; ratio to the pinned round-trip limit)"]
        lines += cold_lines(doc, tgt, "cold stat/read/batches")
        lines += [f"{'workload':<20} {'files/s':>10} {'ratio':>7}  {'target':<28} {'met':>4}"]
        for name, r in rows.items():
            check = target_check(name, rows)
            text, met = check if check is not None else ("", None)
            ratio = f"{r['ratio']:.3f}" if r["ratio"] is not None else "-"
            flag = "" if met is None else ("yes" if met else "no")
            lines.append(f"{name:<20} {r['value']:>10,.0f} {ratio:>7}  {text:<28} {flag:>4}")
    return lines


def dataloader_lines(doc: dict[str, Any]) -> list[str]:
    """The DataLoader rows of each target: samples/s, MiB/s, the limit and ratio, issue 9's
    target (information only), and how many consumers of the stated rate the loader feeds."""
    lines: list[str] = []
    rate = float(doc.get("plan", {}).get("dl_consumer_rate") or 0.0)
    for tgt in doc["targets"]:
        rows = [r for r in doc["results"] if r["target"] == tgt and r["name"].startswith("dl_")]
        if not rows:
            continue
        by_name = {r["name"]: r for r in rows}
        lines += ["", f"DataLoader vs the issue 9 targets ({tgt}; files: ratio to the local plain Dataset, "
                      f"shards: to the cold-read limit; consumer {rate:,.0f} samples/s per GPU)",
                  f"{'workload':<26} {'samples/s':>10} {'MiB/s':>8} {'limit':>52} {'ratio':>6}  "
                  f"{'target':<18} {'met':>4} {'x local':>8} {'x consumer':>11}"]
        for r in rows:
            check = dataloader.target_check(r)
            text, met = check if check is not None else ("", None)
            flag = "" if met is None else ("yes" if met else "no")
            lim = f"{r['limit_name']} {r['limit_value']:,.0f}/s" if r["limit_value"] else ""
            feeds = f"{r['value'] / rate:.1f}x" if rate else "-"
            loc = by_name.get("dl_local_" + r["name"][len("dl_"):])
            vs_local = f"{r['value'] / loc['value']:.2f}" if loc is not None and loc["value"] else ""
            lines.append(f"{r['name']:<26} {r['value']:>10,.0f} {mib_per_s(r['extra']['MBps']):>8,.1f} {lim:>52} "
                         f"{fmt_ratio(r['ratio']):>6}  {text:<18} {flag:>4} {vs_local:>8} {feeds:>11}")
        if rate:
            beats = [r["name"] for r in rows if not r["name"].startswith("dl_local_") and r["value"] > rate]
            lines.append(f"rows beating the consumer rate ({rate:,.0f} samples/s, so no GPU waits): "
                         f"{len(beats)} of {sum(1 for r in rows if not r['name'].startswith('dl_local_'))}")
    return lines


def checkpoint_lines(doc: dict[str, Any]) -> list[str]:
    """The checkpoint rows: MiB/s and seconds, the ratio to the local DCP figure (or to the
    staging copy for the blocked time), and issue 10's targets (information only)."""
    lines: list[str] = []
    for tgt in doc["targets"]:
        rows = [r for r in doc["results"] if r["target"] == tgt and r["name"].startswith("ckpt_")]
        if not rows:
            continue
        lines += ["", f"checkpoints vs the issue 10 targets ({tgt}; save/load: ratio to DCP's local "
                      f"FileSystemWriter/Reader, blocked time: to the in-memory staging copy)",
                  f"{'workload':<22} {'MiB/s':>9} {'seconds':>9} {'limit':>34} {'ratio':>6}  {'target':<18} {'met':>4}"]
        for r in rows:
            check = checkpoint.target_check(r)
            text, met = check if check is not None else ("", None)
            flag = "" if met is None else ("yes" if met else "no")
            secs = r["value"] if r["unit"] == "s" else r["extra"]["seconds"]
            mbps = f"{mib_per_s(r['extra']['MBps']):,.1f}" if "MBps" in r["extra"] else ""
            lim = f"{r['limit_name']} {fmt_value(r['limit_value'], r['unit'])}" if r["limit_value"] else ""
            lines.append(f"{r['name']:<22} {mbps:>9} {secs:>9.3f} {lim:>34} {fmt_ratio(r['ratio']):>6}  "
                         f"{text:<18} {flag:>4}")
        blk = {r["name"]: r for r in rows}.get("ckpt_block_async_s")
        if blk is not None:
            lines.append(f"async save: blocked {blk['value']:.3f} s, done after {blk['extra']['async_total_s']:.3f} s")
    return lines


def _range(lo: float, hi: float, unit: str) -> str:
    return f"{fmt_value(lo, unit).rsplit(' ', 1)[0]}-{fmt_value(hi, unit)}"


def _ratio_text(r: dict[str, Any]) -> str:
    hb = r.get("ratio_hb", r.get("ratio"))
    return fmt_ratio(hb)


def header_lines(doc: dict[str, Any]) -> list[str]:
    """How the figures were taken: rounds, interleaving, what the ratios mean, durability."""
    n = doc.get("rounds", 1)
    lines = [f"{n} round(s), interleaved: each round re-measures the raw limits, then runs "
             + ", ".join(doc["targets"]) + " in turn; figures are medians with their range over the rounds",
             "ratio: median of the per-round figure / that round's limit; x compare: median of the per-round "
             "LoomFS / compare figure; both higher is better (times are turned around); us/op apart"]
    for tgt, text in (doc.get("durability") or {}).items():
        lines.append(f"durability of {tgt}: {text}")
    rounds = doc.get("limits_rounds") or []
    if len(rounds) > 1 and "loopback_tcp_Bps" in rounds[0]:
        tcp = [x["loopback_tcp_Bps"] for x in rounds]
        lines.append(f"raw TCP over the rounds: {human_bytes(min(tcp))}/s - {human_bytes(max(tcp))}/s")
    if len(rounds) > 1:
        rtt = [x["round_trips_per_s"] for x in rounds]
        lines.append(f"raw round trips over the rounds: {min(rtt):,.0f}/s - {max(rtt):,.0f}/s")
    return lines


def cold_read_lines(doc: dict[str, Any]) -> list[str]:
    """Which caches each target's cold reads started without, which stayed warm, and the rows
    faster than a raw round trip (one read at a time: a cache answered, not storage)."""
    lines: list[str] = []
    for tgt in doc["targets"]:
        rows = [r for r in doc["results"] if r["target"] == tgt and "caches" in r["extra"]]
        if not rows:
            continue
        c = rows[0]["extra"]["caches"]
        lines += ["", f"cold reads of {tgt} ({', '.join(r['name'] for r in rows)}):",
                  "  dropped: " + "; ".join(c.get("dropped", [])),
                  "  not dropped: " + "; ".join(c.get("kept", []))]
        for r in rows:
            e = r["extra"]
            if e.get("above_round_trip_limit"):
                lines.append(f"  {r['name']}: {r['value']:,.0f} IOPS is above the raw round-trip limit "
                             f"({e['round_trips_per_s']:,.0f}/s): served from a cache, not storage reads")
    return lines


def table_lines(doc: dict[str, Any]) -> list[str]:
    """The results table: median and range, us/op, limit, ratio to it (higher is better), vs
    disk, and the --compare target with the paired ratio; then cold-read caches, and the
    small-file, DataLoader and checkpoint rows against their targets."""
    lines = limit_lines(doc["limits"]) + header_lines(doc)
    main = [r for r in doc["results"] if r["target"] == "loomfs"]
    other = {r["name"]: r for r in doc["results"] if r["target"] != "loomfs"}
    cmp = bool(other)
    head = (f"{'workload':<26} {'median':>16} {'range':>24} {'us/op':>9} {'limit':>44} {'ratio':>7} "
            f"{'vs disk':>8}")
    if cmp:
        head += f" {'compare':>16} {'compare range':>24} {'x compare':>9} {'x range':>11}"
    lines += ["", head]
    for r in main or list(other.values()):
        lim_text = ""
        if r["limit_value"]:
            lim_text = f"{r['limit_name']} {fmt_value(r['limit_value'], r['unit'])}"
        lo, hi = r.get("min", r["value"]), r.get("max", r["value"])
        us = r.get("us_per_op")
        disk = r["extra"].get("disk_bound_Bps")
        vs_disk = f"{r['value'] / disk:.2f}" if disk else ""
        line = (f"{r['name']:<26} {fmt_value(r['value'], r['unit']):>16} {_range(lo, hi, r['unit']):>24} "
                f"{'' if us is None else f'{us:,.1f}':>9} {lim_text:>44} {_ratio_text(r):>7} {vs_disk:>8}")
        o = other.get(r["name"])
        if cmp and o is not None and main:
            p = r.get("paired")
            x = f"{p['median']:.2f}" if p else "-"
            xr = f"{p['min']:.2f}-{p['max']:.2f}" if p else ""
            olo, ohi = o.get("min", o["value"]), o.get("max", o["value"])
            line += (f" {fmt_value(o['value'], o['unit']):>16} {_range(olo, ohi, o['unit']):>24} {x:>9} "
                     f"{xr:>11}")
        lines.append(line)
        if r["name"].startswith("rand_read"):
            e = r["extra"]
            lines.append(f"{'':<26} p50 {e['p50_ms']:.2f} ms, p95 {e['p95_ms']:.2f} ms, p99 {e['p99_ms']:.2f} ms")
        cpu = r["extra"].get("reader_cpu_s_per_gib")
        if cpu:
            roles = ", ".join(f"{k} {v:.2f}" for k, v in cpu.items() if k != "total")
            lines.append(f"{'':<26} reader CPU-s/GiB {cpu.get('total', 0.0):.2f} ({roles})")
    return (lines + cold_read_lines(doc) + smallfile_lines(doc) + dataloader_lines(doc)
            + checkpoint_lines(doc) + kvcache.target_lines(doc))


def plot(doc: dict[str, Any], path: str) -> None:
    """Four panels: throughput vs limits, latency CDFs, lookup cost vs directory size, mdtest."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    targets = doc["targets"]
    by = {(r["target"], r["name"]): r for r in doc["results"]}
    fig, axes = plt.subplots(2, 2, figsize=(15, 10))
    title = "LoomFS bench" + (" (--quick)" if doc.get("quick") else "") + f", {doc.get('replicas', '?')} replicas"
    fig.suptitle(title)

    ax = axes[0][0]
    names = [r["name"] for r in doc["results"] if r["unit"] == "B/s" and r["target"] == targets[0]]
    width = 0.8 / (len(targets) + 1)
    for i, t in enumerate(targets):
        vals = [by[(t, n)]["value"] / 2**20 if (t, n) in by else 0 for n in names]
        ax.bar([x + i * width for x in range(len(names))], vals, width, label=t[:40])
    lims = [by[(targets[0], n)]["limit_value"] / 2**20 for n in names]
    ax.bar([x + len(targets) * width for x in range(len(names))], lims, width, label="raw limit",
           color="lightgray", edgecolor="gray")
    for x, n in enumerate(names):
        d = by[(targets[0], n)]["extra"].get("disk_bound_Bps")
        if d:
            ax.hlines(d / 2**20, x - width / 2, x + len(targets) * width + width / 2, colors="red",
                      linestyles="dashed", label="disk bound" if x == 0 else None)
    ax.set_xticks([x + width * len(targets) / 2 for x in range(len(names))], names, rotation=20)
    ax.set_ylabel("MiB/s")
    ax.set_title("sequential throughput vs raw limits")
    _legend(ax)

    ax = axes[0][1]
    for t in targets:
        for n in ("rand_read_4k", "rand_read_64k"):
            r = by.get((t, n))
            if r and r["extra"].get("cdf_ms"):
                cdf = r["extra"]["cdf_ms"]
                ax.plot(cdf, [i / (len(cdf) - 1) for i in range(len(cdf))], label=f"{n} {t[:30]}")
    ax.set_xscale("log")
    ax.set_xlabel("latency (ms, log)")
    ax.set_ylabel("fraction of reads")
    ax.set_title("random read latency CDF")
    ax.grid(True, which="both", alpha=0.3)
    _legend(ax)

    ax = axes[1][0]
    for t in targets:
        rows = sorted((r for r in doc["results"] if r["target"] == t and r["name"].startswith("lookup_")),
                      key=lambda r: r["extra"]["entries"])
        if rows:
            xs = [r["extra"]["entries"] for r in rows]
            ax.plot(xs, [r["extra"].get("stat_us", r["value"]) for r in rows], "o-", label=f"stat hit {t[:30]}")
            ax.plot(xs, [r["extra"]["miss_us"] for r in rows], "x--", label=f"stat miss {t[:30]}")
    rtt = doc["limits"]["round_trips_per_s"]
    ax.axhline(1e6 / rtt, color="gray", linestyle=":", label="raw round trip")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("entries in the directory")
    ax.set_ylabel("us per lookup")
    ax.set_title("metadata cost vs directory size")
    _legend(ax)

    ax = axes[1][1]
    md = [r["name"] for r in doc["results"] if r["name"].startswith(("md_", "small_", "sf_")) and r["target"] == targets[0]]
    for i, t in enumerate(targets):
        vals = [by[(t, n)]["value"] if (t, n) in by else 0 for n in md]
        ax.barh([y + i * 0.8 / len(targets) for y in range(len(md))], vals, 0.8 / len(targets), label=t[:40])
    ax.set_yticks(range(len(md)), md, fontsize=7)
    pinned = doc["limits"].get("round_trips_pinned_per_s")
    if pinned and any(n.startswith("sf_") for n in md):
        ax.axvline(pinned, color="gray", linestyle=":", label="raw round trips, 1 CPU")
    ax.set_xscale("log")
    ax.set_xlabel("ops/s (log)")
    ax.set_title("metadata and small files")
    _legend(ax)

    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
