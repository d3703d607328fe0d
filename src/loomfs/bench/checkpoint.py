"""The checkpoint benchmark (issue 10 item 8): ``torch.distributed.checkpoint`` save and load
of a state_dict on LoomFS next to DCP's own ``FileSystemWriter``/``FileSystemReader`` on a
local directory, in the same run.

The state_dict is ``tensors`` fp32 tensors of ``size_bytes`` in all (default 2 GiB in 256
tensors; ``--quick`` 32 MiB). It is saved and loaded:

* ``ckpt_save_1r`` / ``ckpt_load_1r``: one process, ``dcp.save``/``dcp.load`` through
  ``LoomStorageWriter``/``LoomStorageReader`` (atomic: staging directory, fsync, rename,
  ``latest``); held against ``ckpt_local_save`` / ``ckpt_local_load``: the same through
  ``FileSystemWriter(path, sync_files=True, thread_count=4)``/``FileSystemReader`` to a local
  directory (LoomFS writes each rank's items on 4 threads too).
* ``ckpt_save_2r`` / ``ckpt_load_2r``: two ranks (``torch.multiprocessing`` spawn, gloo on
  127.0.0.1), each holding half the tensors under its own names; held against
  ``ckpt_local_save_2r`` / ``ckpt_local_load_2r``. A rank's time runs from a barrier to a
  barrier after the call, so the row is the job's aggregate bytes/s.
* ``ckpt_block_sync_s``: seconds the training loop is blocked by ``dcp.save`` to LoomFS (the
  whole save); ``ckpt_block_async_s``: by ``dcp.async_save`` until it returns its future (the
  future is waited for outside the timing), in the steady state: the second of two async saves
  sharing one ``Stager`` (the first, staging into fresh memory, is ``async_first_s`` in the
  row's extra); ``ckpt_staging_copy_s``: the in-memory staging copy, cloning the state_dict
  into fresh CPU memory: the issue's yardstick (async blocks <= the staging copy); its extra
  ``staging_copy_warm_s`` is the same copy (``Tensor.copy_``) into those tensors again, touched
  (median of 3: the memory state of a reused staging copy), and ``vs_warm_copy`` the async block
  against it (glibc often hands freed pages back, so the "fresh" clone may be warm as well). The block rows are held against the staging copy, the staging copy
  against the memcpy limit.

Before every phase (LoomFS or local, save or load) the bench waits until the cluster deletes
nothing (``wait_quiet``: meta's GC queue and trims empty, so no storage node still removes an
earlier phase's checkpoints), then ``os.sync``; the rows' ``quiet_wait_s`` says how long.
Before each load the data is made cold as far as an unprivileged process can: ``os.sync``,
then every local checkpoint file (and the cluster's own files when the cluster runs from a
local directory, as with ``--start``) is dropped from the page cache with
``posix_fadvise(DONTNEED)``; LoomFS loads use a fresh client. Targets (save >= 0.8 of the
local save, load >= 1.0 of the local load, async block <= staging copy) are information,
not assertions. A ``--compare`` (local) target gets no rows: the local figures sit beside
the LoomFS ones already.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from loomfs.bench.dataloader import check_torch, drop_tree
from loomfs.bench.procio import Cost, Meter, storage_pids
from loomfs.bench.targets import BenchTarget, LoomTarget
from loomfs.bench.workloads import Result

TENSORS = 256
THREADS = 4  # LoomStorageWriter's files_per_rank default; FileSystemWriter gets as many threads
TARGETS = {"save": 0.8, "load": 1.0}  # of the local figure
RANKS = 2
SPAWN_TIMEOUT_S = 1800.0
QUIET_TIMEOUT_S = 180.0  # the longest a phase waits for the cluster's GC to finish
QUIET_POLL_S = 0.2


def wait_quiet(fs: Any, *, timeout_s: float = QUIET_TIMEOUT_S, poll_s: float = QUIET_POLL_S,
               sync: Callable[[], None] = os.sync, clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep) -> float:
    """Wait until the cluster deletes nothing: meta's GC queue (unlinked files whose chunks
    wait for removal, the delay included) and its trims are empty, so no storage node removes
    an earlier phase's chunks while the next phase is measured; then flush the page cache
    (``sync``), so neither side of the comparison pays for an earlier phase's dirty pages.
    Every phase, LoomFS or local, waits the same way. Returns the seconds waited; raises
    TimeoutError after ``timeout_s`` (a file held open keeps its GC entry)."""
    t0 = clock()
    while True:
        st = fs.statfs()
        if not st.gc_pending and not st.trims_pending:
            break
        if clock() - t0 > timeout_s:
            raise TimeoutError(f"checkpoint bench: the cluster still deletes after {timeout_s:.0f} s "
                               f"({st.gc_pending} GC entries, {st.trims_pending} trims pending)")
        sleep(poll_s)
    sync()
    return clock() - t0


def row_names() -> list[str]:
    """The rows ``run_checkpoint`` returns for a LoomFS target, in order."""
    return ["ckpt_save_1r", "ckpt_load_1r", "ckpt_local_save", "ckpt_local_load",
            "ckpt_disk_save_1r", "ckpt_disk_local_save",
            "ckpt_save_2r", "ckpt_load_2r", "ckpt_local_save_2r", "ckpt_local_load_2r",
            "ckpt_disk_save_2r", "ckpt_disk_local_save_2r",
            "ckpt_block_sync_s", "ckpt_block_async_s", "ckpt_staging_copy_s"]


def steps() -> int:
    """Progress steps per target: 1 rank (LoomFS, local), blocked time, 2 ranks."""
    return 3


def make_state(size_bytes: int, tensors: int, *, prefix: str = "", seed: int = 7) -> dict[str, Any]:
    """``tensors`` fp32 tensors of about ``size_bytes`` in all (random values, seeded)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    n = max(1, size_bytes // 4 // max(1, tensors))
    return {f"{prefix}layer{i:04d}.weight": torch.rand(n, generator=gen) for i in range(tensors)}


def empty_like(state: Mapping[str, Any]) -> dict[str, Any]:
    import torch

    return {k: torch.zeros_like(v) for k, v in state.items()}


def state_bytes(state: Mapping[str, Any]) -> int:
    return sum(int(v.numel()) * v.element_size() for v in state.values())


def check_equal(a: Mapping[str, Any], b: Mapping[str, Any], what: str) -> None:
    import torch

    bad = [k for k in a if not torch.equal(a[k], b[k])]
    if bad:
        raise RuntimeError(f"checkpoint bench: {what} loaded {len(bad)} tensor(s) that differ, e.g. {bad[0]}")


def cold(local: str | None, where: str) -> None:
    """Flush and drop the local checkpoint files and the cluster's files (when local)."""
    if local is not None:
        drop_tree(local)
    if os.path.isdir(where):
        drop_tree(where)


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _costs(prefix: str, client: Cost, store: Cost | None) -> dict[str, float]:
    """A save's costs: the saving processes' CPU seconds and disk bytes (``client``), and the
    storage processes' (``store``, LoomFS saves only)."""
    out = {f"{prefix}client_cpu_s": client.cpu_s, f"{prefix}client_disk_bytes": float(client.write_bytes)}
    if store is not None:
        out |= {f"{prefix}storage_cpu_s": store.cpu_s, f"{prefix}storage_disk_bytes": float(store.write_bytes)}
    return out


def one_rank(fs: Any, where: str, run: str, local: str, state: dict[str, Any]) -> dict[str, float]:
    """Save and load ``state`` once through LoomFS and once through DCP's local FileSystem pair."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

    import loomfs
    from loomfs.checkpoint import LoomStorageReader, LoomStorageWriter

    out: dict[str, float] = {}
    store, me = Meter(list(storage_pids(where))), Meter([None])
    out["save_quiet_s"] = wait_quiet(fs)
    store.start()
    me.start()
    out["save_s"] = _timed(lambda: dcp.save(state, storage_writer=LoomStorageWriter(run, fs, step=1)))
    out |= _costs("", me.stop(), store.stop())
    dest = empty_like(state)
    out["load_quiet_s"] = wait_quiet(fs)
    cold(None, where)
    with loomfs.connect(where) as fresh:
        out["load_s"] = _timed(lambda: dcp.load(dest, storage_reader=LoomStorageReader(run, fresh)))
    check_equal(state, dest, "LoomFS")
    out["local_save_quiet_s"] = wait_quiet(fs)
    me.start()
    out["local_save_s"] = _timed(lambda: dcp.save(
        state, storage_writer=FileSystemWriter(local, sync_files=True, thread_count=THREADS)))
    out |= _costs("local_", me.stop(), None)
    dest = empty_like(state)
    out["local_load_quiet_s"] = wait_quiet(fs)
    cold(local, where)
    out["local_load_s"] = _timed(lambda: dcp.load(dest, storage_reader=FileSystemReader(local)))
    check_equal(state, dest, "local")
    return out


def blocked(fs: Any, run: str, state: dict[str, Any]) -> dict[str, float]:
    """Seconds the caller is blocked by ``dcp.save`` and by ``dcp.async_save`` (to its
    future), and the staging copy (a clone of every tensor into fresh CPU memory).

    Two async saves run one after the other with one ``Stager``, as a training loop saves
    every N steps: the first stages into fresh memory (``async_first_s``), the second into
    the first one's (``async_s``, the steady state the row reports)."""
    import torch.distributed.checkpoint as dcp

    from loomfs.checkpoint import LoomStorageWriter, Stager

    out: dict[str, float] = {}
    t0 = time.perf_counter()
    staged = {k: v.detach().to("cpu", copy=True) for k, v in state.items()}
    out["staging_copy_s"] = time.perf_counter() - t0
    warm = []  # the same copy into those (now touched) tensors: the memory state of a reused copy
    for _ in range(3):
        t0 = time.perf_counter()
        for k, v in state.items():
            staged[k].copy_(v)
        warm.append(time.perf_counter() - t0)
    out["staging_copy_warm_s"] = sorted(warm)[1]
    del staged
    writer = LoomStorageWriter(run, fs, step=2)
    wait_quiet(fs)
    out["sync_s"] = _timed(lambda: dcp.save(state, storage_writer=writer))
    fs.rmtree(writer.checkpoint_path)  # one checkpoint on the cluster at a time (disk space)
    stager = Stager()
    for step, key in ((3, "async_first_s"), (4, "async_s")):
        writer = LoomStorageWriter(run, fs, step=step, stager=stager)
        wait_quiet(fs)
        t0 = time.perf_counter()
        fut = dcp.async_save(state, storage_writer=writer)
        out[key] = time.perf_counter() - t0
        done: Any = getattr(fut, "upload_completion", fut)  # an AsyncSaveResponse, or the future itself
        done.result()
        out[key.replace("_s", "_total_s")] = time.perf_counter() - t0
        fs.rmtree(writer.checkpoint_path)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_main(rank: int, world: int, port: int, where: str, run: str, local: str, size_bytes: int,
              tensors: int, out_path: str, store_pids: list[int]) -> None:
    """One rank of the 2-rank run (spawned): its half of the tensors under its own names,
    saved and loaded through LoomFS and through the local FileSystem pair; rank 0 writes the
    barrier-to-barrier seconds of each phase to ``out_path`` as JSON, with the saves' costs:
    both ranks' CPU seconds and disk bytes, and (rank 0 measures them) the storage
    processes' ``store_pids``."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

    import loomfs
    from loomfs.checkpoint import LoomStorageReader, LoomStorageWriter

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    quiet = loomfs.connect(where) if rank == 0 else None  # rank 0 waits for the cluster's GC
    try:
        state = make_state(size_bytes // world, tensors // world, prefix=f"rank{rank}.", seed=11 + rank)
        secs: dict[str, float] = {}

        def phase(name: str, fn: Callable[[], Any], costs: str | None = None) -> None:
            me, store = Meter([None]), Meter(list(store_pids) if rank == 0 and costs == "" else [])
            if quiet is not None:  # rank 0: no earlier phase's files are still being deleted
                secs[name.removesuffix("_s") + "_quiet_s"] = wait_quiet(quiet)
            dist.barrier()
            me.start()
            store.start()
            t0 = time.perf_counter()
            fn()
            dist.barrier()
            secs[name] = time.perf_counter() - t0
            if costs is not None:
                c, s = me.stop(), store.stop()
                both = torch.tensor([c.cpu_s, c.write_bytes, s.cpu_s, s.write_bytes], dtype=torch.float64)
                dist.all_reduce(both)  # the job's sums
                c_cpu, c_disk, s_cpu, s_disk = both.tolist()
                secs.update(_costs(costs, Cost(c_cpu, int(c_disk)), Cost(s_cpu, int(s_disk)) if costs == "" else None))

        def drop(local_dir: str | None) -> None:
            if quiet is not None:
                wait_quiet(quiet)
                cold(local_dir, where)
            dist.barrier()

        with loomfs.connect(where) as fs:
            phase("save_s", lambda: dcp.save(state, storage_writer=LoomStorageWriter(run, fs, step=1)), "")
        dest = empty_like(state)
        drop(None)
        with loomfs.connect(where) as fs:
            phase("load_s", lambda: dcp.load(dest, storage_reader=LoomStorageReader(run, fs)))
        check_equal(state, dest, f"LoomFS, rank {rank}")
        phase("local_save_s", lambda: dcp.save(
            state, storage_writer=FileSystemWriter(local, sync_files=True, thread_count=THREADS)), "local_")
        dest = empty_like(state)
        drop(local)
        phase("local_load_s", lambda: dcp.load(dest, storage_reader=FileSystemReader(local)))
        check_equal(state, dest, f"local, rank {rank}")
        if rank == 0:
            with open(out_path, "w") as f:
                json.dump({**secs, "bytes": state_bytes(state) * world}, f)
    finally:
        if quiet is not None:
            quiet.close()
        dist.destroy_process_group()


def two_ranks(where: str, run: str, local: str, size_bytes: int, tensors: int) -> dict[str, float]:
    import torch.multiprocessing as mp

    fd, out_path = tempfile.mkstemp(prefix="bench-ckpt-", suffix=".json")
    os.close(fd)
    try:
        ctx = mp.spawn(rank_main, args=(RANKS, _free_port(), where, run, local, size_bytes, tensors, out_path,
                                             storage_pids(where)),
                       nprocs=RANKS, join=False)
        deadline = time.monotonic() + SPAWN_TIMEOUT_S
        while not ctx.join(timeout=max(1.0, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                raise TimeoutError(f"checkpoint bench: 2 ranks took over {SPAWN_TIMEOUT_S:.0f} s")
        with open(out_path) as f:
            res: dict[str, float] = json.load(f)
        return res
    finally:
        os.unlink(out_path)


def run_checkpoint(t: BenchTarget, base: str, *, size_bytes: int, lim: Mapping[str, float], local_dir: str,
                   step: Callable[[str], None], tag: str = "", tensors: int = TENSORS) -> list[Result]:
    """All checkpoint rows (``row_names``) for a LoomFS target; none for a local one. The
    local copies live in a fresh directory under ``local_dir``, removed at the end."""
    if (why := check_torch()) is not None:
        raise RuntimeError(why)
    if not isinstance(t, LoomTarget):
        return []
    fs, where = t.fs, t.spec[1]
    made = tempfile.mkdtemp(prefix="bench-ckpt-", dir=local_dir)
    try:
        with warnings.catch_warnings():
            # one process without a process group is what the 1-rank rows ask for
            warnings.filterwarnings("ignore", message=".*assuming the intent is to", category=UserWarning)
            state = make_state(size_bytes, tensors)
            nbytes = state_bytes(state)
            step(f"checkpoint: save/load {nbytes >> 20} MiB, 1 rank, LoomFS and local{tag}")
            t.makedirs(f"{base}/ckpt")
            one = one_rank(fs, where, f"{base}/ckpt/r1", os.path.join(made, "r1"), state)
            t.rmtree(f"{base}/ckpt/r1")  # bounded disk use: 3 replicas of 2 GiB per checkpoint
            shutil.rmtree(os.path.join(made, "r1"), ignore_errors=True)
            step(f"checkpoint: blocked time, sync vs async save{tag}")
            blk = blocked(fs, f"{base}/ckpt/blk", state)
            del state
            step(f"checkpoint: save/load {nbytes >> 20} MiB, {RANKS} ranks (gloo){tag}")
            two = two_ranks(where, f"{base}/ckpt/r2", os.path.join(made, "r2"), size_bytes, tensors)
            t.rmtree(f"{base}/ckpt")
    finally:
        shutil.rmtree(made, ignore_errors=True)
    return _rows(one, blk, two, nbytes, tensors, lim)


def _rows(one: Mapping[str, float], blk: Mapping[str, float], two: Mapping[str, float], nbytes: int,
          tensors: int, lim: Mapping[str, float]) -> list[Result]:
    out: list[Result] = []
    for ranks, r in ((1, one), (RANKS, two)):
        total = int(r.get("bytes", nbytes))
        sfx = "" if ranks == 1 else f"_{ranks}r"
        base_extra = {"bytes": total, "tensors": tensors, "ranks": ranks, "threads": THREADS}
        local_vals = {}
        for op, disk_key in (("save", "disk_fsync_write_Bps"), ("load", "disk_fsync_read_Bps")):
            v = total / r[f"local_{op}_s"]
            local_vals[op] = v
            out.append(Result(f"ckpt_local_{op}{sfx}", v, "B/s", "local disk " + ("write+fsync" if op == "save" else "read"),
                              lim[disk_key], {**base_extra, "seconds": r[f"local_{op}_s"], "MBps": v / 1e6,
                                                  "quiet_wait_s": r.get(f"local_{op}_quiet_s", 0.0)}))
        for op in ("save", "load"):
            v = total / r[f"{op}_s"]
            out.append(Result(f"ckpt_{op}_{ranks}r", v, "B/s", f"local DCP {op} {ranks}r", local_vals[op],
                              {**base_extra, "seconds": r[f"{op}_s"], "MBps": v / 1e6, "target_ratio": TARGETS[op],
                               "quiet_wait_s": r.get(f"{op}_quiet_s", 0.0)}))
        out += _disk_rows(r, total, ranks, sfx, lim)
    out.sort(key=lambda res: row_names().index(res.name))
    stage = blk["staging_copy_s"]
    mem_s = nbytes / lim["memcpy_Bps"]
    extra = {"bytes": nbytes, "tensors": tensors, "async_total_s": blk["async_total_s"],
             "async_first_s": blk["async_first_s"], "async_first_total_s": blk["async_first_total_s"]}
    out.append(Result("ckpt_block_sync_s", blk["sync_s"], "s", "staging copy", stage, extra))
    warm_s = blk.get("staging_copy_warm_s", 0.0)
    out.append(Result("ckpt_block_async_s", blk["async_s"], "s", "staging copy", stage,
                      {**extra, "target_ratio_max": 1.0, "staging_copy_warm_s": warm_s,
                       "vs_warm_copy": blk["async_s"] / warm_s if warm_s else 0.0}))
    out.append(Result("ckpt_staging_copy_s", stage, "s", "memcpy", mem_s, extra))
    return out


def _disk_rows(r: Mapping[str, float], total: int, ranks: int, sfx: str, lim: Mapping[str, float]) -> list[Result]:
    """What each side of a save wrote to the disk, as bytes/s against the disk's fsync'd
    write limit: the local writer writes one copy, LoomFS one per replica (the storage
    processes' ``write_bytes``), all to the same disk here. ``copies`` says how many; the
    extra ``disk_bound_Bps`` is the save rate the limit allows at that many copies
    (``disk_direct_bound_Bps``: the same for the disk's O_DIRECT write rate), and
    ``cpu_s_per_GiB`` what the processes spent per GiB saved (for LoomFS: the storage
    processes; ``client_cpu_s_per_GiB`` the saving ranks)."""
    out = []
    gib = total / (1 << 30)
    fsync_w = lim["disk_fsync_write_Bps"]
    for name, prefix, who in ((f"ckpt_disk_save_{ranks}r", "", "storage"),
                              (f"ckpt_disk_local_save{sfx}", "local_", "client")):
        secs = r[f"{prefix}save_s"]
        disk = float(r.get(f"{prefix}{who}_disk_bytes", 0.0))
        copies = disk / total if total else 0.0
        extra = {"bytes": total, "ranks": ranks, "disk_bytes": disk, "copies": copies, "seconds": secs,
                 "MBps": disk / secs / 1e6, "disk_bound_Bps": fsync_w / copies if copies else 0.0,
                 "save_vs_disk_bound": (total / secs) / (fsync_w / copies) if copies else 0.0,
                 # the O_DIRECT write rate of the same disk (how LoomFS writes chunks) per copy
                 "disk_direct_bound_Bps": lim.get("disk_write_Bps", 0.0) / copies if copies else 0.0,
                 "cpu_s_per_GiB": r.get(f"{prefix}{who}_cpu_s", 0.0) / gib if gib else 0.0,
                 "client_cpu_s_per_GiB": r.get(f"{prefix}client_cpu_s", 0.0) / gib if gib else 0.0}
        out.append(Result(name, disk / secs, "B/s", "local disk write+fsync", fsync_w, extra))
    return out


def target_check(row: Mapping[str, Any]) -> tuple[str, bool] | None:
    """The issue's target for a ``ckpt_`` row as (text, met), or None where it sets none."""
    ratio = row.get("ratio")
    e = row["extra"]
    if "target_ratio" in e:
        return f">= {e['target_ratio']:g} of local", ratio is not None and ratio >= e["target_ratio"]
    if "target_ratio_max" in e:
        return "<= staging copy", ratio is not None and ratio <= e["target_ratio_max"]
    return None
