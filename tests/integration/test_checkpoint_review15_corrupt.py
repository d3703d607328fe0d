"""A checkpoint load reads chunks it wants whole with one READ into the items covering them
(a ``Scatter`` of several when several items share a chunk; storage sends the stored chunk
CRC and checks no blocks itself): a replica whose copy rotted is caught by the client's CRC
check, reported, and the chunk read from another replica; the load gets the saved bytes
without ``verify``. The staging layout is durable, in 1 MiB chunks of four 256 KiB items."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

import loomfs
from loomfs.checkpoint import LoomStorageReader, LoomStorageWriter, list_checkpoints
from loomfs.net.scatter import Scatter
from loomfs.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

CHUNK = 1 << 20


def _chunk_files(root: Path, inode: int, index: int) -> list[Path]:
    return sorted(root.glob(f"storage*/target*/chunks/*/{inode:x}.{index:x}.*"))


def test_a_rotten_replica_is_read_around_in_a_whole_chunk_load(fs: loomfs.LoomFS, base: str, cluster: LocalCluster,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    run = f"{base}/run"
    g = torch.Generator().manual_seed(15)
    state = {f"w{i:02d}": torch.rand(CHUNK // 16, generator=g) for i in range(48)}  # 256 KiB each: 12 MiB
    dcp.save(state, storage_writer=LoomStorageWriter(run, fs, step=1, files_per_rank=1, chunk_size=CHUNK))
    (ck,) = list_checkpoints(fs, run)
    (name,) = [n for n in fs.listdir(ck.path) if n.endswith(".distcp")]
    path = f"{ck.path}/{name}"
    layout = fs.get_layout(path)
    assert layout is not None and layout.chunk_size == CHUNK and not layout.ec_k
    inode, size = fs.stat(path).st_ino, fs.stat(path).st_size
    chunks = size // CHUNK
    # the replica a chunk's reads go to turns with each chunk on a chain: with every replica but
    # one rotten in 3 rounds of the chains, some reads go to a rotten one whatever the inode
    assert chunks >= 3 * len(layout.chains), (chunks, layout.chains)
    rotten = 0
    for index in range(chunks):
        files = _chunk_files(Path(cluster.root), inode, index)
        assert len(files) == cluster.replicas, files
        for p in files[1:]:
            with open(p, "r+b") as f:
                f.seek(CHUNK // 2 + 1000)
                bad = bytes(b ^ 0x5A for b in f.read(64))
                f.seek(CHUNK // 2 + 1000)
                f.write(bad)
            rotten += 1
    storage: Any = fs.client.storage  # a StorageClient
    before = storage.corrupt_reports_total
    real = storage.read_chunk
    scattered: list[int] = []

    async def counted(layout: Any, inode_: int, index: int, offset: int, length: int, into: Any) -> int:
        if isinstance(into, Scatter) and inode_ == inode:
            scattered.append(index)
        return await real(layout, inode_, index, offset, length, into)

    monkeypatch.setattr(storage, "read_chunk", counted)
    got = {k: torch.zeros_like(v) for k, v in state.items()}
    dcp.load(got, storage_reader=LoomStorageReader(run, fs))
    assert all(torch.equal(state[k], got[k]) for k in state), [k for k in state if not torch.equal(state[k], got[k])]
    assert sorted(scattered) == list(range(chunks))  # every chunk whole, into its four items
    assert storage.corrupt_reports_total > before, "no rotten replica was read (or it was not caught)"
