"""The checkpoint benchmark's measurement phases (``checkpoint`` runs them and describes
them): the state_dict, waiting until the cluster deletes nothing (``wait_quiet``), the 1-rank
save and load through LoomFS and DCP's local FileSystem pair (``one_rank``), the blocked time
of sync and async saves against the staging copy (``blocked``), and the 2-rank run
(``two_ranks``, spawning ``rank_main``)."""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

from loomfs.bench.dataloader import drop_tree
from loomfs.bench.procio import Cost, Meter, storage_pids

THREADS = 4  # LoomStorageWriter's files_per_rank default; FileSystemWriter gets as many threads
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

