"""``loomfs bench --mount``: the same workloads through a FUSE mount of the cluster, through
the native client API, and on a local directory (the native disk), in one run.

Big sequential write/read (unbuffered 1 MiB requests through the mount, the client's 16 MiB
blocks natively, 4 MiB blocks + fsync locally), 4 KiB random reads with 1 and 8 threads,
and small files (create+write, stat, read). Every figure prints its ratio to the native
client's (the issue's target: big reads through the mount >= 0.7 of it) and the raw limits
of the same run (loopback TCP, the local disk read back cold).

Caches are emptied the same way for every target before a read: the mount's and the local
file's kernel pages are dropped (``posix_fadvise DONTNEED``), the native client is a new
one; the storage servers' own page cache is warm for both LoomFS targets.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import loomfs
from loomfs.bench import limits

MOUNT_BLOCK_BYTES = 1 << 20  # a 1 MiB read/write per call: FUSE's request size with max_pages
NATIVE_BLOCK_BYTES = 16 << 20
LOCAL_BLOCK_BYTES = 4 << 20
IO_BYTES = 4096


@dataclass
class MountPlan:
    big_bytes: int = 512 << 20
    rand_count: int = 2000  # 4 KiB reads per thread count
    threads: tuple[int, ...] = (1, 8)
    small_files: int = 1000
    small_bytes: int = 4096
    mount_options: str = ""  # extra -o for the mount
    rounds: int = 1  # every target once per round, interleaved: medians and per-round ratios
    compare_dir: str = ""  # another file system's directory (a MooseFS mount): the same workloads there
    small_only: bool = False  # only the small-file workloads (``--only small``)

    @classmethod
    def quick(cls) -> MountPlan:
        return cls(big_bytes=32 << 20, rand_count=200, small_files=100)


@dataclass
class Row:
    name: str
    unit: str
    mount: float
    native: float
    local: float
    compare: float = 0.0  # the --compare directory's (0: none)
    vs_compare_rounds: tuple[float, ...] = ()  # mount / compare of each round

    @property
    def vs_native(self) -> float:
        return self.mount / self.native if self.native else 0.0

    @property
    def vs_compare(self) -> float:
        return self.mount / self.compare if self.compare else 0.0


class _Files:
    """One target's file operations: plain paths (mount, local) or the client API (native)."""

    def __init__(self, root: str, *, fs: Any = None, where: str = "", block_bytes: int = MOUNT_BLOCK_BYTES,
                 daemon_pid: int | None = None):
        self.root, self.fs, self.where, self.block_bytes = root, fs, where, block_bytes
        self.daemon_pid = daemon_pid  # the mount's: its CPU is counted with the reader's
        self.read_cpu: dict[str, float] = {}  # CPU seconds per GiB of the last read_big

    def p(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    def makedirs(self, rel: str) -> None:
        if self.fs is not None:
            self.fs.makedirs(self.p(rel), exist_ok=True)
        else:
            os.makedirs(self.p(rel), exist_ok=True)

    def remove(self, rel: str) -> None:
        """A big file goes once measured (the next round writes its own; disks stay small)."""
        if self.fs is not None:
            self.fs.rm(self.p(rel))
        else:
            os.unlink(self.p(rel))

    def write_big(self, rel: str, total: int) -> float:
        if self.fs is not None:
            from loomfs.bench.workloads import seq_write

            return seq_write(self.fs, self.p(rel), total, NATIVE_BLOCK_BYTES)[0]
        block = self.block_bytes
        buf = memoryview(bytearray(os.urandom(block)))
        fd = os.open(self.p(rel), os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
        t0 = time.perf_counter()
        try:
            done = 0
            while done < total:
                done += os.write(fd, buf[:min(block, total - done)])
            os.fsync(fd)
        finally:
            os.close(fd)
        return total / (time.perf_counter() - t0)

    def read_big(self, rel: str, size: int) -> float:
        """Bytes/s of a cold sequential read; ``read_cpu``: CPU seconds per GiB it took (user
        and system, of this process: the reader, or the native client with its threads; and
        of the mount daemon)."""
        d0 = _proc_cpu_s(self.daemon_pid)
        t0_cpu = os.times()
        if self.fs is not None:
            from loomfs.bench.workloads import seq_read

            with loomfs.connect(self.where) as cold:  # its caches empty
                rate = seq_read(cold, self.p(rel), NATIVE_BLOCK_BYTES)
        else:
            buf = bytearray(self.block_bytes)
            fd = os.open(self.p(rel), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                total = 0
                t0 = time.perf_counter()
                while n := os.readv(fd, [buf]):
                    total += n
                rate = total / (time.perf_counter() - t0)
            finally:
                os.close(fd)
        t1_cpu, d1 = os.times(), _proc_cpu_s(self.daemon_pid)
        gib = size / (1 << 30)
        self.read_cpu = {"reader_user": (t1_cpu.user - t0_cpu.user) / gib,
                         "reader_sys": (t1_cpu.system - t0_cpu.system) / gib}
        if d0 is not None and d1 is not None:
            self.read_cpu |= {"daemon_user": (d1[0] - d0[0]) / gib, "daemon_sys": (d1[1] - d0[1]) / gib}
        return rate

    def random_reads(self, rel: str, size: int, threads: int, count: int) -> float:
        """``count`` 4 KiB reads at random aligned offsets, split over ``threads``; IOPS."""
        slots = max(1, size // IO_BYTES)
        per = max(1, count // threads)
        opener: Callable[[], Any]
        if self.fs is not None:
            def opener() -> Any:
                return self.fs.open(self.p(rel), "rb")
        else:
            def opener() -> Any:
                fd = os.open(self.p(rel), os.O_RDONLY)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                return fd
        handles = [opener() for _ in range(threads)]
        errors: list[BaseException] = []

        def run(k: int) -> None:
            rng = random.Random(k)
            buf = bytearray(IO_BYTES)
            h = handles[k]
            try:
                for _ in range(per):
                    off = rng.randrange(slots) * IO_BYTES
                    if isinstance(h, int):
                        os.preadv(h, [buf], off)
                    else:
                        h.seek(off)
                        h.readinto(buf)
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                errors.append(exc)

        ts = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        dt = time.perf_counter() - t0
        for h in handles:
            os.close(h) if isinstance(h, int) else h.close()
        if errors:
            raise errors[0]
        return per * threads / dt

    def small_files(self, rel: str, count: int, size: int) -> tuple[float, float, float]:
        """create+write, stat, read of ``count`` files; files/s each."""
        data = os.urandom(size)
        names = [self.p(f"{rel}/s{i:06d}") for i in range(count)]
        if self.fs is not None:
            self.fs.makedirs(self.p(rel), exist_ok=True)
            put: Callable[[str], object] = lambda n: self.fs.pipe(n, data)  # noqa: E731
            st: Callable[[str], object] = self.fs.stat
            get: Callable[[str], object] = self.fs.cat
        else:
            os.makedirs(self.p(rel), exist_ok=True)

            def put(n: str) -> None:
                with open(n, "wb") as f:
                    f.write(data)

            def get(n: str) -> bytes:
                with open(n, "rb") as f:
                    # cold for the kernel: pages the create left are dropped (for every
                    # target alike: the mount's open drops them anyway, another FUSE file
                    # system's may keep them)
                    os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
                    return f.read()

            st = os.stat
        rates = []
        for fn in (put, st, get):
            t0 = time.perf_counter()
            for n in names:
                fn(n)
            rates.append(count / (time.perf_counter() - t0))
        return rates[0], rates[1], rates[2]


def _proc_cpu_s(pid: int | None) -> tuple[float, float] | None:
    """(user, system) CPU seconds of process ``pid`` so far (None: no such process)."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


@contextlib.contextmanager
def mounted(where: str, mgmtd: bool, options: str) -> Iterator[str]:
    """``loomfs mount`` (the daemon, as users run it) at a fresh directory; unmounted after."""
    from loomfs.mount import daemon

    mp = tempfile.mkdtemp(prefix="loomfs-bench-mnt-")
    argv = ["--mgmtd" if mgmtd else "--dir", where, "mount", mp]
    if options:
        argv += ["-o", options]
    daemon.start_background(argv, mp)
    try:
        yield mp
    finally:
        daemon.umount(mp)
        os.rmdir(mp)


def run_mount_bench(where: str, plan: MountPlan, local_dir: str, *, mgmtd: bool = False,
                    step: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Mount, native, local (and ``plan.compare_dir``'s) figures for every workload, each
    target once per round, and the raw limits."""
    step("raw limits: loopback TCP, local disk (fsync'd write, cold read)")
    lim = {"loopback_tcp_Bps": limits.loopback_tcp_bytes_per_s(min(plan.big_bytes, 1 << 30))}
    lim["disk_fsync_write_Bps"], lim["disk_fsync_read_Bps"] = limits.disk_fsync_write_read_bytes_per_s(
        local_dir, min(plan.big_bytes, 256 << 20))
    tag = f"bench-mount-{os.getpid()}"
    local_root = tempfile.mkdtemp(prefix="loomfs-bench-local-", dir=local_dir)
    compare_root = tempfile.mkdtemp(prefix="loomfs-bench-", dir=plan.compare_dir) if plan.compare_dir else ""
    per_round: list[dict[str, dict[str, float]]] = []
    cpu: dict[str, dict[str, float]] = {}
    with loomfs.connect(where) as fs:
        fs.makedirs(f"/.bench/{tag}", exist_ok=True)
        native = _Files(f"/.bench/{tag}/native", fs=fs, where=where)
        fs.makedirs(native.root, exist_ok=True)
        try:
            with mounted(where, mgmtd, plan.mount_options) as mp:
                from loomfs.mount import daemon

                pid_text = daemon.state_files(mp)[0].read_text().strip()
                mnt = _Files(f"{mp}/.bench/{tag}/mnt", daemon_pid=int(pid_text) if pid_text.isdigit() else None)
                os.makedirs(mnt.root)
                loc = _Files(local_root, block_bytes=LOCAL_BLOCK_BYTES)
                targets = [("mount", mnt), ("native", native), ("local", loc)]
                if compare_root:
                    targets.append(("compare", _Files(compare_root)))
                for rnd in range(plan.rounds):
                    vals: dict[str, dict[str, float]] = {}
                    for label, t in targets:
                        v = vals.setdefault(label, {})
                        sub = f"r{rnd}"
                        t.makedirs(sub)
                        if not plan.small_only:
                            step(f"round {rnd + 1}: big file write/read, {plan.big_bytes >> 20} MiB: {label}")
                            v["seq_write"] = t.write_big(f"{sub}/big", plan.big_bytes)
                            v["seq_read"] = t.read_big(f"{sub}/big", plan.big_bytes)
                            cpu[label] = t.read_cpu
                            for n in plan.threads:
                                step(f"round {rnd + 1}: 4 KiB random reads, {n} thread(s): {label}")
                                v[f"rand_4k_{n}t"] = t.random_reads(f"{sub}/big", plan.big_bytes, n, plan.rand_count)
                            t.remove(f"{sub}/big")
                        step(f"round {rnd + 1}: small files, {plan.small_files} x {plan.small_bytes} B: {label}")
                        v["small_create"], v["small_stat"], v["small_read"] = t.small_files(
                            f"{sub}/small", plan.small_files, plan.small_bytes)
                    per_round.append(vals)
        finally:
            fs.rmtree(f"/.bench/{tag}")
            shutil.rmtree(local_root, ignore_errors=True)
            if compare_root:
                shutil.rmtree(compare_root, ignore_errors=True)
    rows = _rows(per_round)
    return {"plan": plan.__dict__, "limits": lim,
            "rows": [r.__dict__ | {"vs_native": r.vs_native, "vs_compare": r.vs_compare} for r in rows],
            "rounds": per_round, "seq_read_cpu_s_per_gib": cpu}


_UNITS = {"seq_write": "MB/s", "seq_read": "MB/s", "small_create": "files/s", "small_stat": "files/s",
          "small_read": "files/s"}


def _rows(per_round: list[dict[str, dict[str, float]]]) -> list[Row]:
    """Medians over the rounds, and each round's mount / compare."""
    rows = []
    for name in per_round[0]["mount"]:
        scale = 1e-6 if _UNITS.get(name) == "MB/s" else 1.0

        def med(label: str, name: str = name, scale: float = scale) -> float:
            got = [r[label][name] * scale for r in per_round if label in r]
            return statistics.median(got) if got else 0.0

        paired = tuple(r["mount"][name] / r["compare"][name] for r in per_round
                       if "compare" in r and r["compare"].get(name))
        rows.append(Row(name, _UNITS.get(name, "IOPS"), med("mount"), med("native"), med("local"),
                        med("compare"), paired))
    return rows
def table_lines(doc: dict[str, Any]) -> list[str]:
    lim = doc["limits"]
    compare = bool(doc["plan"].get("compare_dir"))
    rounds = doc["plan"].get("rounds", 1)
    out = [f"raw limits: loopback TCP {lim['loopback_tcp_Bps'] / 1e6:.0f} MB/s, local disk fsync'd write "
           f"{lim['disk_fsync_write_Bps'] / 1e6:.0f} MB/s, cold read {lim['disk_fsync_read_Bps'] / 1e6:.0f} MB/s"
           + (f"; medians of {rounds} rounds" if rounds > 1 else ""),
           f"{'workload':<16} {'unit':<8} {'mount':>10} {'native':>10} {'local':>10} "
           + (f"{'compare':>10} " if compare else "")
           + f"{'mount/native':>13} " + (f"{'mount/compare':>14} " if compare else "") + f"{'mount/limit':>12}"]
    for r in doc["rows"]:
        limit = ""
        if r["name"] in ("seq_read", "seq_write"):
            limit = f"{r['mount'] * 1e6 / lim['loopback_tcp_Bps']:.2f} TCP"
        line = f"{r['name']:<16} {r['unit']:<8} {r['mount']:>10.1f} {r['native']:>10.1f} {r['local']:>10.1f} "
        if compare:
            line += f"{r['compare']:>10.1f} "
        line += f"{r['vs_native']:>13.2f} "
        if compare:
            line += f"{r['vs_compare']:>14.2f} "
        out.append(line + f"{limit:>12}")
    if compare and rounds > 1:
        out.append("mount / compare per round: " + "; ".join(
            f"{r['name']} " + " ".join(f"{x:.2f}" for x in r["vs_compare_rounds"]) for r in doc["rows"]))
    cpu = doc.get("seq_read_cpu_s_per_gib") or {}
    if cpu:
        def fmt(d: dict[str, float]) -> str:
            return ", ".join(f"{k} {v:.2f}" for k, v in d.items())
        out.append("big read, CPU seconds per GiB (user/sys; the mount's reader's system time is the copy out of "
                   "the page cache, the daemon's mostly the copy into it):")
        out += [f"  {label}: {fmt(d)}" for label, d in cpu.items()]
    return out


def cmd_bench_mount(args: Any, where: str, disk_dir: str) -> int:
    """``loomfs bench --mount [--quick] [--size N] [--mount-options O] [--json F]``."""
    import json
    from pathlib import Path

    plan = MountPlan.quick() if args.quick else MountPlan()
    if args.size is not None:
        plan.big_bytes = args.size
    plan.mount_options = args.mount_options
    plan.rounds = max(1, getattr(args, "rounds", 1) or 1)
    plan.compare_dir = getattr(args, "compare_dir", None) or ""
    if getattr(args, "files_small", None):
        plan.small_files = args.files_small
    only = getattr(args, "only", None)
    if only:
        if only != "small":
            raise SystemExit("loomfs bench --mount --only: only 'small' (the small-file workloads)")
        plan.small_only = True
    show = not args.no_progress

    def step(text: str) -> None:
        if show:
            print(f"  {text}", flush=True)

    doc = run_mount_bench(where, plan, disk_dir, mgmtd=bool(args.mgmtd), step=step)
    print("\n".join(table_lines(doc)))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(doc, indent=2))
        print(f"results written to {args.json_path}")
    return 0
