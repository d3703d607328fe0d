"""The whole benchmark: raw limits, then every workload against each target, with progress.

``run_bench(targets, plan, replicas)`` returns a JSON-ready document; ``bench.report``
prints and plots it. Every figure carries the raw limit it is compared with.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from loomfs.bench import checkpoint, dataloader, hosts, kvcache, limits, metaservers, smallfiles
from loomfs.bench import ec as ec_bench
from loomfs.bench.parallel import parallel_bigfile, parallel_mdtest
from loomfs.bench.rounds import median_limits, pair, summarize
from loomfs.bench.targets import BenchTarget
from loomfs.bench.workloads import (
    Result,
    durable_dir,
    lookup_scaling,
    random_reads,
    seq_read_cpu,
    seq_write,
    small_files,
)

SCHEMA_VERSION = 2
READDIR_ENTRY_BYTES = 256  # an entry with its attributes on the wire (at most), for readdir's bound
# Workload groups ``--only`` picks from: big files (sequential, random, N processes), mdtest,
# the older small-file pass, lookup cost vs directory size, the issue-16 small-file benchmark,
# PyTorch DataLoader samples/s over files and shards, LoomFS vs local (issue 9, needs torch),
# DCP checkpoint save/load and blocked time, LoomFS vs local (issue 10, needs torch).
GROUPS = ("bigfile", "mdtest", "small", "lookup", "smallfiles", "dataloader", "checkpoint", "metaservers", "ec",
          "kvcache", "hosts", "auth")  # kvcache: KV cache put/get by value size and batch (issue 14)
# hosts: aggregate read with 1, 2, 3 storage hosts in network namespaces (issue 12; root only)
# auth: 64 B RPC round trips and connection set-up, auth off / token / TLS + token (issue 13, bench/auth.py)
# ec: erasure coding vs 3 replicas on a 6-node cluster of its own that it kills servers of (issue 11)
OPT_IN_GROUPS = ("metaservers", "ec", "kvcache", "hosts", "auth")  # only with --only: clusters of their own (issue 12: 1 SQLite, 1-2 PostgreSQL metas)
PINNED_LIMIT_NAME = "raw round trips, 1 CPU"


@dataclass
class Plan:
    big_bytes: int = 1 << 30
    procs: int = 4
    big_each_bytes: int = 256 << 20
    rand_4k_count: int = 3000
    rand_64k_count: int = 1000
    md_files: int = 2000  # per process
    md_procs: tuple[int, ...] = (1, 4)
    lookup_sizes: list[int] = field(default_factory=lambda: [1000, 100_000, 1_000_000])
    lookup_samples: int = 2000
    small: list[tuple[int, int]] = field(default_factory=lambda: [(20_000, 4096), (2_000, 128 << 10)])
    tcp_bytes: int = 2 << 30
    rtt_count: int = 20_000
    disk_bytes: int = 512 << 20
    rounds: int = 1
    groups: list[str] = field(default_factory=lambda: [g for g in GROUPS if g not in OPT_IN_GROUPS])
    sf_files: int = 20_000
    sf_dirs: int = 100
    sf_size_bytes: int = 4096
    sf_threads: tuple[int, ...] = (1, 4)
    sf_batch_files: int = 1000
    dl_sets: list[tuple[int, int]] = field(default_factory=lambda: [(20_000, 4096), (10_000, 112 << 10)])
    dl_workers: tuple[int, ...] = (4,)
    dl_batch_size: int = 64
    dl_shard_bytes: int = 64 << 20
    dl_dirs: int = 100
    dl_consumer_rate: float = 2000.0  # samples/s one GPU eats (about a ResNet-50 training step rate)
    ckpt_bytes: int = 2 << 30  # the state_dict saved and loaded (fp32, checkpoint.TENSORS tensors)
    ec_bytes: int = 256 << 20  # the file the ec group writes and reads, replicated and erasure-coded

    @classmethod
    def quick(cls) -> Plan:
        return cls(big_bytes=32 << 20, procs=2, big_each_bytes=8 << 20, rand_4k_count=200,
                   rand_64k_count=100, md_files=100, lookup_sizes=[100, 1000, 3000], lookup_samples=200,
                   small=[(200, 4096), (40, 128 << 10)], tcp_bytes=64 << 20, rtt_count=2000,
                   disk_bytes=32 << 20, sf_files=400, sf_dirs=20, sf_batch_files=100,
                   dl_sets=[(300, 4096), (100, 112 << 10)], dl_workers=(0, 2), dl_shard_bytes=1 << 20,
                   dl_dirs=10, ckpt_bytes=32 << 20, ec_bytes=32 << 20)

    def network_and_disk(self) -> bool:
        """Whether the chosen groups need the bandwidth, disk and memcpy limits (the
        small-file benchmark alone needs only round trips)."""
        return bool(set(self.groups) - {"smallfiles"})


def measure_limits(plan: Plan, disk_dir: str, step: Callable[[str], None]) -> dict[str, float]:
    if not plan.network_and_disk():
        step("raw loopback round trips: a pinned pair, a free pair")
        return {"round_trips_pinned_per_s": limits.loopback_round_trips_pinned_per_s(plan.rtt_count),
                "round_trips_per_s": limits.loopback_round_trips_per_s(plan.rtt_count)}
    step("raw loopback TCP, 1 and 2 streams")
    tcp1 = limits.loopback_tcp_bytes_per_s(plan.tcp_bytes)
    tcp2 = limits.loopback_tcp_bytes_per_s(plan.tcp_bytes // 2, streams=2)
    step("raw loopback round trips, 1 and 2 pairs, a pinned pair")
    rtt1 = limits.loopback_round_trips_per_s(plan.rtt_count)
    rtt2 = limits.loopback_round_trips_per_s(plan.rtt_count, pairs=2)
    rttp = limits.loopback_round_trips_pinned_per_s(plan.rtt_count)
    step("local disk: O_DIRECT chunk files, fsync'd file")
    dw, dr = limits.disk_write_read_bytes_per_s(disk_dir, plan.disk_bytes)
    fw, fr = limits.disk_fsync_write_read_bytes_per_s(disk_dir, plan.disk_bytes)
    step("memcpy")
    mem = limits.memcpy_bytes_per_s()
    return {
        "loopback_tcp_Bps": tcp1, "loopback_tcp_2streams_Bps": tcp2,
        "round_trips_per_s": rtt1, "round_trips_2pairs_per_s": rtt2, "round_trips_pinned_per_s": rttp,
        "disk_write_Bps": dw, "disk_read_Bps": dr,
        "disk_fsync_write_Bps": fw, "disk_fsync_read_Bps": fr,
        "memcpy_Bps": mem,
    }


class _Limits:
    """Which raw limit a figure is held against, for a cluster (network) or a local directory."""

    def __init__(self, lim: dict[str, float], replicas: int, local: bool):
        self.lim, self.replicas, self.local = lim, replicas, local

    def write(self, streams: int) -> tuple[str, float, dict[str, Any]]:
        if self.local:
            return "local disk write+fsync", self.lim["disk_fsync_write_Bps"], {}
        tcp = self.lim["loopback_tcp_Bps" if streams == 1 else "loopback_tcp_2streams_Bps"]
        name = f"raw TCP x{min(streams, 2)} / {self.replicas} replicas"
        return name, tcp / self.replicas, {"disk_bound_Bps": self.lim["disk_write_Bps"] / self.replicas}

    def durable_write(self, replicas: int) -> tuple[str, float, dict[str, Any]]:
        """A durable write: every replica writes its copy to this host's disk (storage writes
        chunk files with O_DIRECT, then fsyncs), so min(raw TCP, disk O_DIRECT write) / replicas
        (all replicas share one disk here); the buffered write+fsync figure rides along."""
        if self.local or not replicas:
            return "local disk write+fsync", self.lim["disk_fsync_write_Bps"], {}
        tcp, disk = self.lim["loopback_tcp_Bps"], self.lim["disk_write_Bps"]
        extra = {"tcp_Bps": tcp, "disk_bound_Bps": disk / replicas,
                 "disk_fsync_write_Bps": self.lim["disk_fsync_write_Bps"]}
        which = "disk" if disk < tcp else "TCP"
        return (f"min(raw TCP, disk O_DIRECT write) / {replicas} replicas = {which}", min(tcp, disk) / replicas,
                extra)

    def read(self, streams: int) -> tuple[str, float, dict[str, Any]]:
        if self.local:
            return "local disk read", self.lim["disk_fsync_read_Bps"], {}
        # issue 15 item 21: a cold read is held against min(raw TCP, the disk's O_DIRECT read)
        tcp = self.lim["loopback_tcp_Bps" if streams == 1 else "loopback_tcp_2streams_Bps"]
        disk = self.lim["disk_read_Bps"]
        extra = {"tcp_Bps": tcp, "disk_bound_Bps": disk}
        if disk < tcp:
            return f"min(raw TCP x{min(streams, 2)}, disk O_DIRECT read) = disk", disk, extra
        return f"min(raw TCP x{min(streams, 2)}, disk O_DIRECT read) = TCP", tcp, extra

    def readdir(self, procs: int = 1) -> tuple[str, float]:
        """What a listing could reach: one round trip per page of ``READDIR_PAGE`` entries plus
        the page's bytes over TCP (entries of ``READDIR_ENTRY_BYTES``)."""
        if self.local:
            return "", 0.0
        return readdir_limit(self.lim, procs)

    def ops(self, procs: int, io_bytes: int = 0) -> tuple[str, float]:
        if self.local:
            return "", 0.0
        rtt = self.lim["round_trips_per_s" if procs == 1 else "round_trips_2pairs_per_s"]
        name = "raw round trips" + ("" if procs == 1 else " x2")
        if io_bytes:
            by_bw = self.lim["loopback_tcp_Bps"] / io_bytes
            if by_bw < rtt:
                return f"raw TCP / {io_bytes >> 10} KiB", by_bw
        return name, rtt


def readdir_limit(lim: dict[str, float], procs: int = 1) -> tuple[str, float]:
    """Entries/s of a listing at the raw limits: per page of ``READDIR_PAGE`` entries one
    round trip and ``READDIR_PAGE * READDIR_ENTRY_BYTES`` over TCP (not TCP / entry size
    alone: a page waits for its round trip)."""
    from loomfs.client.core import READDIR_PAGE

    rtt = lim["round_trips_per_s" if procs == 1 else "round_trips_2pairs_per_s"]
    tcp = lim["loopback_tcp_Bps" if procs == 1 else "loopback_tcp_2streams_Bps"]
    per_page_s = 1.0 / rtt + READDIR_PAGE * READDIR_ENTRY_BYTES / tcp
    name = f"round trips{'' if procs == 1 else ' x2'} x {READDIR_PAGE}-entry pages"
    return name, READDIR_PAGE / per_page_s


def run_target(t: BenchTarget, plan: Plan, lim: dict[str, float], replicas: int, rnd: int,
               step: Callable[[str], None], disk_dir: str | None = None) -> list[Result]:
    local = t.spec[0] == "local"
    L = _Limits(lim, 1 if local else replicas, local)
    base = f"/.bench/r{rnd}"
    t.rmtree(base)
    t.makedirs(base)
    out: list[Result] = []
    tag = "" if not local else " (compare)"
    groups = set(plan.groups)
    if "bigfile" in groups:
        out += _bigfile(t, plan, L, base, tag, step)
    if "mdtest" in groups:
        out += _mdtest(t, plan, lim, L, base, tag, step)
    if "small" in groups:
        out += _small(t, plan, L, base, tag, step)
    if "smallfiles" in groups:
        out += smallfiles.run_smallfiles(
            t, f"{base}/sf", files=plan.sf_files, dirs=plan.sf_dirs, size_bytes=plan.sf_size_bytes,
            threads=tuple(plan.sf_threads), batch_files=plan.sf_batch_files,
            limit=(PINNED_LIMIT_NAME, lim["round_trips_pinned_per_s"]), step=step, tag=tag)
    if "lookup" in groups:
        out += _lookup(t, plan, lim, local, base, tag, step)
    if "dataloader" in groups:
        out += dataloader.run_dataloader(
            t, f"{base}/dl", sets=plan.dl_sets, workers=plan.dl_workers, batch_size=plan.dl_batch_size,
            shard_bytes=plan.dl_shard_bytes, dirs=plan.dl_dirs, consumer_rate=plan.dl_consumer_rate, lim=lim,
            local_dir=disk_dir or tempfile.gettempdir(), step=step, tag=tag)
    if "ec" in groups and not local:
        out += ec_bench.run_ec(plan.ec_bytes, lim, step, tag)
    if "metaservers" in groups and not local:  # clusters of its own: 1 meta on SQLite, 1 and 2 on PostgreSQL
        out += metaservers.run_metaservers(lim, files=plan.md_files, procs=plan.procs, step=step)
    if "hosts" in groups and not local:  # clusters of its own, each service on its own namespace host
        out += hosts.run_hosts(lim, size_bytes=max(64 << 20, min(plan.big_bytes, 512 << 20)), step=step)
    if "auth" in groups and not local:  # a server process of its own per mode
        out += _auth(plan, step)
    if "checkpoint" in groups:
        out += checkpoint.run_checkpoint(t, base, size_bytes=plan.ckpt_bytes, lim=lim,
                                         local_dir=disk_dir or tempfile.gettempdir(), step=step, tag=tag)
    if "kvcache" in groups:
        out += kvcache.run_kvcache(t, base, lim=lim, replicas=replicas, bytes_per_case=min(64 << 20, plan.big_bytes),
                                   batch_bytes_max=plan.big_bytes, step=step, tag=tag)
    t.rmtree(base)
    return out


def _bigfile(t: BenchTarget, plan: Plan, L: _Limits, base: str, tag: str,
             step: Callable[[str], None]) -> list[Result]:
    out: list[Result] = []
    step(f"big file write/read, 1 process{tag}")
    w, _ = seq_write(t, f"{base}/big", plan.big_bytes)
    n, v, ex = L.write(1)
    out.append(Result("seq_write", w, "B/s", n, v, {**ex, "durability": t.durability()}))
    caches = t.drop_caches(f"{base}/big")
    c = t.cold([f"{base}/big"])
    try:
        # this process's CPU-s per GiB read, in all and by thread role (loop, recv, main, other)
        r, cpu = seq_read_cpu(c, f"{base}/big")
    finally:
        c.close()
    n, v, ex = L.read(1)
    out.append(Result("seq_read", r, "B/s", n, v, {**ex, "caches": caches, "reader_cpu_s_per_gib": cpu}))
    out.append(_durable_write(t, plan, L, base, tag, step))

    rtt = L.lim["round_trips_per_s"]
    for io, count in ((4096, plan.rand_4k_count), (64 << 10, plan.rand_64k_count)):
        step(f"random {io >> 10} KiB reads{tag}")
        caches = t.drop_caches(f"{base}/big")
        c = t.cold([f"{base}/big"])
        try:
            rr = random_reads(c, f"{base}/big", plan.big_bytes, io, count)
        finally:
            c.close()
        n, v = L.ops(1, io)
        # one read at a time: faster than a raw round trip means served from a cache here
        rr.update(caches=caches, round_trips_per_s=rtt, above_round_trip_limit=rr["iops"] > rtt)
        out.append(Result(f"rand_read_{io >> 10}k", rr["iops"], "IOPS", n, v, rr))

    step(f"big files, {plan.procs} processes{tag}")
    t.makedirs(f"{base}/par")
    par = parallel_bigfile(t.spec, f"{base}/par", plan.procs, plan.big_each_bytes)
    n, v, ex = L.write(plan.procs)
    out.append(Result(f"seq_write_{plan.procs}p", par["write"], "B/s", n, v, {"procs": plan.procs, **ex}))
    n, v, ex = L.read(plan.procs)
    out.append(Result(f"seq_read_{plan.procs}p", par["read"], "B/s", n, v, {"procs": plan.procs, **ex}))
    t.rmtree(f"{base}/par")
    t.rmtree(f"{base}/big")
    return out


def _durable_write(t: BenchTarget, plan: Plan, L: _Limits, base: str, tag: str,
                   step: Callable[[str], None]) -> Result:
    """``seq_write_durable`` (issue 15 item 21): the big file written into a ``durable`` layout
    directory on 2-replica chains (every replica fsyncs before the ack), against the compare
    directory's write with fsync before close (MooseFS: goal 2)."""
    d = f"{base}/durable"
    replicas = durable_dir(t, d)
    step(f"durable big file write, {replicas or 'fsync before close'}{' replicas' if replicas else ''}{tag}")
    w, _ = seq_write(t, f"{d}/big", plan.big_bytes)
    t.rmtree(d)
    n, v, ex = L.durable_write(replicas)
    return Result("seq_write_durable", w, "B/s", n, v, {**ex, "replicas": replicas, "durability": t.durability()})


def _mdtest(t: BenchTarget, plan: Plan, lim: dict[str, float], L: _Limits, base: str, tag: str,
            step: Callable[[str], None]) -> list[Result]:
    out: list[Result] = []
    for procs in plan.md_procs:
        for shared in (True, False):
            mode = "shared" if shared else "perproc"
            step(f"mdtest {procs} process(es), {mode} dir{tag}")
            d = f"{base}/md{procs}{mode}"
            t.makedirs(d)
            md = parallel_mdtest(t.spec, d, procs, plan.md_files, shared=shared)
            for phase in ("create", "stat", "readdir", "unlink"):
                if phase == "readdir":
                    n, v = L.readdir(procs)
                    unit = "entries/s"
                else:
                    n, v = L.ops(procs)
                    unit = "ops/s"
                out.append(Result(f"md_{phase}_{procs}p_{mode}", md[phase], unit, n, v,
                                  {"procs": procs, "files_per_proc": plan.md_files}))
            t.rmtree(d)
    return out


def _small(t: BenchTarget, plan: Plan, L: _Limits, base: str, tag: str,
           step: Callable[[str], None]) -> list[Result]:
    out: list[Result] = []
    for count, size in plan.small:
        label = f"{size >> 10}k"
        step(f"small files {count} x {label}{tag}")
        sf = small_files(t, f"{base}/small{label}", count, size)
        for phase in ("create", "stat", "read"):
            n, v = L.ops(1, size if phase != "stat" else 0)
            out.append(Result(f"small_{label}_{phase}", sf[phase], "files/s", n, v, {"files": count, "size_bytes": size}))
        t.rmtree(f"{base}/small{label}")
    return out


def _lookup(t: BenchTarget, plan: Plan, lim: dict[str, float], local: bool, base: str, tag: str,
            step: Callable[[str], None]) -> list[Result]:
    out: list[Result] = []
    step(f"lookup cost vs directory size {plan.lookup_sizes}{tag}")
    scaling = lookup_scaling(t, f"{base}/huge", plan.lookup_sizes, plan.lookup_samples)
    list_name, list_limit = ("", 0.0) if local else readdir_limit(lim)
    for row in scaling:
        n_ent = int(row["entries"])
        # lookups/s (higher is better, like every other row); the microseconds are in us_per_op
        out.append(Result(f"lookup_{n_ent}", 1e6 / row["stat_us"], "lookups/s", "" if local else "raw round trips",
                          0.0 if local else lim["round_trips_per_s"],
                          {"entries": n_ent, "stat_us": row["stat_us"], "miss_us": row["miss_us"]}))
        out.append(Result(f"dir_create_{n_ent}", row["create_per_s"], "files/s",
                          "" if local else "raw round trips", 0.0 if local else lim["round_trips_per_s"],
                          {"entries": n_ent}))
        out.append(Result(f"dir_list_{n_ent}", row["list_per_s"], "entries/s", list_name, list_limit,
                          {"entries": n_ent}))
    t.rmtree(f"{base}/huge")
    return out


def _auth(plan: Plan, step: Callable[[str], None]) -> list[Result]:
    """``loomfs.bench.auth`` (auth's module) as rows: each mode against the raw limits it measured."""
    from loomfs.bench import auth

    step("auth: 64 B RPC round trips and connects, off / token / tls+token")
    out: list[Result] = []
    for r in auth.run(count=min(plan.rtt_count, 5000), rounds=1):
        mode = r["mode"].replace("+", "_")
        out.append(Result(f"auth_rpc_64B_{mode}", r["rpc_64B_round_trips_per_s"], "ops/s",
                          "raw round trips pinned, 64 B", r["raw_round_trips_per_s"], {"mode": r["mode"]}))
        out.append(Result(f"auth_connects_{mode}", r["connects_per_s"], "connects/s", "raw TCP connects",
                          r["raw_connects_per_s"], {"mode": r["mode"]}))
    return out


def steps_total(plan: Plan, targets: int) -> int:
    per_group = {"bigfile": 1 + 1 + 2 + 1, "mdtest": 2 * len(plan.md_procs), "small": len(plan.small),
                 "lookup": 1, "smallfiles": smallfiles.steps(tuple(plan.sf_threads)),
                 "dataloader": dataloader.steps(len(plan.dl_sets), len(plan.dl_workers)),
                 "checkpoint": checkpoint.steps(), "metaservers": metaservers.steps(),
                 "ec": ec_bench.steps(), "kvcache": kvcache.steps(plan.big_bytes), "hosts": hosts.steps(), "auth": 1}
    per_target = sum(per_group[g] for g in set(plan.groups))
    return ((4 if plan.network_and_disk() else 1) + per_target * targets) * plan.rounds


def run_bench(targets: list[BenchTarget], plan: Plan, replicas: int, disk_dir: str | None = None,
              *, quick: bool = False, show_progress: bool = True) -> dict[str, Any]:
    disk_dir = disk_dir or tempfile.gettempdir()
    progress = Progress(TextColumn("{task.description:<52}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), disable=not show_progress)
    with progress:
        task = progress.add_task("raw limits", total=steps_total(plan, len(targets)))
        first = [True]

        def step(text: str) -> None:
            if not first[0]:
                progress.advance(task)
            first[0] = False
            progress.update(task, description=text)

        # interleaved: each round measures the limits again, then runs every target once
        per_round_limits: list[dict[str, float]] = []
        rounds: dict[str, list[list[Result]]] = {t.name: [] for t in targets}
        for i in range(plan.rounds):
            lim = measure_limits(plan, disk_dir, step)
            per_round_limits.append(lim)
            for t in targets:
                rounds[t.name].append(run_target(t, plan, lim, replicas, i, step, disk_dir))
        rows = {t.name: summarize(t.name, rounds[t.name]) for t in targets}
        for t in targets[1:]:
            pair(rows[targets[0].name], rows[t.name], t.name)
        results = [r for t in targets for r in rows[t.name]]
        progress.advance(task)
        progress.update(task, description="done")
    lim = median_limits(per_round_limits)
    return {"schema": SCHEMA_VERSION, "quick": quick, "rounds": plan.rounds, "replicas": replicas,
            "plan": asdict(plan), "limits": lim, "limits_rounds": per_round_limits,
            "targets": [t.name for t in targets], "results": results,
            "durability": {t.name: t.durability() for t in targets},
            "cold_caches": {t.name: t.cold_caches() for t in targets}, "interleaved": True}
