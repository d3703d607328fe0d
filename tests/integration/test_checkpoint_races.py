"""A checkpoint deleted by retention while it loads: the load reads its own bytes (the files
are held at meta as orphans while read), never zeros. Failed on the code before (no hold: meta
dropped each file at its unlink and storage collected its chunks)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

import loomfs
from loomfs.checkpoint import LoomStorageReader, LoomStorageWriter, list_checkpoints, prune
from loomfs.checkpoint._holds import ReadHolds
from loomfs.testing import LocalCluster
from loomfs.wire.meta import SetattrReq

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _state(v: float) -> dict[str, torch.Tensor]:
    return {f"t{i}": torch.full((1 << 18,), v) for i in range(4)}


def test_prune_during_a_load_keeps_the_files_it_reads(fs: loomfs.LoomFS, base: str, cluster: LocalCluster) -> None:
    run = f"{base}/run"
    dcp.save(_state(1.0), storage_writer=LoomStorageWriter(run, fs, step=1, files_per_rank=1))
    old = list_checkpoints(fs, run)[0].path
    other = loomfs.connect(str(cluster.root))
    client = fs.client
    real_open = ReadHolds.open
    held: list[Any] = []

    async def open_then_prune(self: ReadHolds, path: str) -> Any:
        f = await real_open(self, path)  # opened under its hold
        if path.endswith(".distcp") and not held:
            def retire() -> None:
                dcp.save(_state(2.0), storage_writer=LoomStorageWriter(run, other, step=2))
                assert old.rsplit("/", 1)[1] in prune(other, run, keep_last=1).delete
            await asyncio.to_thread(retire)
            # by inode: meta still has the file (an orphan), nameless now
            rsp = await client.meta.setattr(SetattrReq(path=path, inode=f.inode))
            held.append(rsp.attr)
        return f

    ReadHolds.open = open_then_prune  # type: ignore[method-assign]
    try:
        got = {k: torch.full_like(v, -7.0) for k, v in _state(0.0).items()}
        dcp.load(got, storage_reader=LoomStorageReader(old, fs))
    finally:
        ReadHolds.open = real_open  # type: ignore[method-assign]
        other.close()
    assert held and held[0].nlink == 0
    assert all(torch.equal(v, torch.full_like(v, 1.0)) for v in got.values())
    assert not fs.exists(old)
