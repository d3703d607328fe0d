"""A storage server killed (kill -9) in the middle of a checkpoint save does not fail the
save (issue 10, item 7): the client's writes move to the reconfigured chains, the save
commits, and the checkpoint loads back bitwise and verifies against its checksums."""

from __future__ import annotations

import random
import threading

import pytest
import torch
import torch.distributed.checkpoint as dcp
from faultkit import start_cluster

import loomfs
from loomfs.checkpoint import (
    LoomStorageReader,
    LoomStorageWriter,
    _writer,
    list_checkpoints,
    verify,
)
from loomfs.testing import LocalCluster

pytestmark = [pytest.mark.integration]


def _state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {f"layer{i}": torch.randn(256, 1024, generator=g) for i in range(24)}  # 24 MiB


@pytest.mark.timeout(240)
def test_storage_killed_during_save(make_cluster: list[LocalCluster], seed: int) -> None:
    c = start_cluster("ckptkill")
    make_cluster.append(c)
    rng = random.Random(seed)
    victim = rng.choice(["storage1", "storage2", "storage3"])
    kill_at = rng.randint(2, 10)  # after this many items were written
    written = [0]
    killed = threading.Event()

    def hook(where: str) -> None:
        if where == "item":
            written[0] += 1
            if written[0] == kill_at and not killed.is_set():
                killed.set()
                c.kill_service(victim)

    fs = loomfs.connect(str(c.root))
    _writer.fault_point = hook
    try:
        state = _state(seed)
        dcp.save(state, storage_writer=LoomStorageWriter("/run", fs, step=1, files_per_rank=4))
        assert killed.is_set(), f"the save wrote only {written[0]} items"
        (ck,) = list_checkpoints(fs, "/run")
        assert ck.complete
        got = {k: torch.zeros_like(v) for k, v in state.items()}
        dcp.load(got, storage_reader=LoomStorageReader("/run", fs, verify=True))
        assert all(torch.equal(got[k], v) for k, v in state.items())
        assert verify(fs, "/run").errors == []
    finally:
        _writer.fault_point = None
        fs.close()
