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

import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Mapping

from loomfs.bench.checkpoint_phases import (
    RANKS,
    blocked,
    make_state,
    one_rank,
    state_bytes,
    two_ranks,
    wait_quiet,
)
from loomfs.bench.checkpoint_rows import row_names, rows, target_check
from loomfs.bench.dataloader import check_torch
from loomfs.bench.targets import BenchTarget, LoomTarget
from loomfs.bench.workloads import Result

__all__ = ["TENSORS", "row_names", "run_checkpoint", "steps", "target_check", "wait_quiet"]

TENSORS = 256


def steps() -> int:
    """Progress steps per target: 1 rank (LoomFS, local), blocked time, 2 ranks."""
    return 3


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
    return rows(one, blk, two, nbytes, tensors, lim)
