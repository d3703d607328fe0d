"""kill -9 of a process in the middle of a checkpoint save, at every commit point and after a
random number of item writes: the previous checkpoint stays loadable (bitwise), and the next
save commits; prune removes what the killed one left in staging."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys

import pytest
import torch
import torch.distributed.checkpoint as dcp

import loomfs
from loomfs.checkpoint import (
    LoomStorageReader,
    LoomStorageWriter,
    list_checkpoints,
    prune,
    read_latest,
)
from loomfs.checkpoint import _layout as L
from loomfs.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

CHILD = r"""
import os, signal, sys
import torch, torch.distributed.checkpoint as dcp
import loomfs
from loomfs.checkpoint import LoomStorageWriter, _writer
cluster, run, point, nth = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
seen = 0
def hook(where):
    global seen
    if where == point:
        seen += 1
        if seen >= nth:
            os.kill(os.getpid(), signal.SIGKILL)
_writer.fault_point = hook
fs = loomfs.connect(cluster)
g = torch.Generator().manual_seed(2)
state = {f"t{i}": torch.randn(64, 1024, generator=g) for i in range(12)}
dcp.save(state, storage_writer=LoomStorageWriter(run, fs, step=2, files_per_rank=3))
print("not killed", flush=True)
"""


def state_of(step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return {f"t{i}": torch.randn(64, 1024, generator=g) for i in range(12)}


def test_kill9_during_save_keeps_previous(fs: loomfs.LoomFS, base: str, cluster: LocalCluster) -> None:
    seed = int(os.environ.get("LOOMFS_TEST_SEED", random.randrange(1 << 30)))
    print(f"seed={seed}")
    rng = random.Random(seed)
    points = [("staged", 1), ("item", rng.randint(1, 12)), ("written", 1), ("metadata", 1),
              ("renamed", 1), ("latest", 1)]
    runs = {p: f"{base}/run-{p}" for p, _ in points}
    for run in runs.values():
        dcp.save(state_of(1), storage_writer=LoomStorageWriter(run, fs, step=1))
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    children = [subprocess.Popen([sys.executable, "-c", CHILD, str(cluster.root), runs[p], p, str(n)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) for p, n in points]
    for (p, n), child in zip(points, children, strict=True):
        out, err = child.communicate(timeout=120)
        assert child.returncode == -signal.SIGKILL, f"{p}#{n} (seed={seed}): rc={child.returncode} {err.decode()[-2000:]}"

    for p, _ in points:
        run = runs[p]
        steps = {c.step: c.complete for c in list_checkpoints(fs, run)}
        latest = read_latest(fs, run)
        assert latest is not None
        expect_step = 2 if p == "latest" else 1
        assert L.parse_step(latest) == expect_step, (p, latest, seed)
        if p in ("renamed", "latest"):
            assert steps == {1: True, 2: True} and L.list_staging(fs, run) == []
        else:
            assert steps == {1: True} and len(L.list_staging(fs, run)) == 1, (p, seed)
        got = {k: torch.zeros_like(v) for k, v in state_of(0).items()}
        dcp.load(got, storage_reader=LoomStorageReader(run, fs, verify=True))
        want = state_of(expect_step)
        assert all(torch.equal(got[k], want[k]) for k in want), (p, seed)
        # the next save commits; it leaves the killed save's staging directory (fresh: it could
        # be a save still writing), which goes once abandoned (here: prune with age 0)
        left = L.list_staging(fs, run)
        dcp.save(state_of(3), storage_writer=LoomStorageWriter(run, fs, step=3))
        assert L.list_staging(fs, run) == left
        prune(fs, run, keep_last=5, staging_age_s=0)
        assert L.list_staging(fs, run) == []
        dcp.load(got, storage_reader=LoomStorageReader(run, fs))
        assert all(torch.equal(got[k], v) for k, v in state_of(3).items())
