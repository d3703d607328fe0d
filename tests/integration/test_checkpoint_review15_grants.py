"""On a cluster whose storage refuses READs without a read grant, a checkpoint load by a
token's user reads its chunks whole with ``StorageClient.read_chunk`` straight (not through
the file's ``pread``): each READ must carry the grant of the file the load's read hold opened,
and no READ may be refused. A user the files' mode does not let read fails at the hold's OPEN
(EACCES), before any READ. Fixtures of ``test_read_grants`` (its own cluster)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from test_read_grants import rg_cluster, token  # noqa: F401 (fixtures)
from torch.distributed.checkpoint.api import CheckpointException

import loomfs
from loomfs.checkpoint import LoomStorageReader, LoomStorageWriter, list_checkpoints
from loomfs.config import ClientConfig, RpcConfig
from loomfs.net.scatter import Scatter
from loomfs.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

CHUNK = 1 << 20


def test_a_whole_chunk_load_carries_the_read_grant(rg_cluster: LocalCluster, token: Callable[..., Path],  # noqa: F811
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    c = rg_cluster
    admin = loomfs.connect(str(c.root))
    try:
        admin.mkdir("/ckg", mode=0o777)
        admin.chmod("/ckg", 0o777)
    finally:
        admin.close()
    g = torch.Generator().manual_seed(3)
    state = {f"w{i}": torch.rand(CHUNK // 16, generator=g) for i in range(12)}  # 3 MiB: 3 chunks
    u = loomfs.connect(str(c.root), config=ClientConfig(rpc=RpcConfig(token_file=str(token(1001, 1001)))))
    try:
        dcp.save(state, storage_writer=LoomStorageWriter("/ckg/run", u, step=1, files_per_rank=1, chunk_size=CHUNK))
    finally:
        u.close()
    (ck,) = list_checkpoints(loomfs.connect(str(c.root)), "/ckg/run")
    u = loomfs.connect(str(c.root), config=ClientConfig(rpc=RpcConfig(token_file=str(token(1001, 1001)))))
    try:
        storage: Any = u.client.storage  # a StorageClient
        real = storage.read_chunk_crc
        grants: list[bytes] = []

        async def watched(layout: Any, inode: int, index: int, offset: int, length: int, into: Any) -> Any:
            if isinstance(into, Scatter):
                grants.append(storage.read_grants.get(inode) or b"")
            return await real(layout, inode, index, offset, length, into)

        monkeypatch.setattr(storage, "read_chunk_crc", watched)
        got = {k: torch.zeros_like(v) for k, v in state.items()}
        dcp.load(got, storage_reader=LoomStorageReader(ck.path, u))
        assert all(torch.equal(state[k], got[k]) for k in state)
        assert len(grants) == 3 and all(grants), grants  # every chunk whole, each READ with a grant
    finally:
        u.close()
    # a user the files' mode does not let read: refused at meta
    admin = loomfs.connect(str(c.root))
    try:
        for n in admin.listdir(ck.path):
            if n.endswith(".distcp"):  # the metadata stays readable: the data files' holds are refused
                admin.chmod(f"{ck.path}/{n}", 0o600)
    finally:
        admin.close()
    other = loomfs.connect(str(c.root), config=ClientConfig(rpc=RpcConfig(token_file=str(token(1002, 1002)))))
    try:
        with pytest.raises(CheckpointException, match=r"Errno 13.*permission denied"):  # a BaseException
            dcp.load({k: torch.zeros_like(v) for k, v in state.items()}, storage_reader=LoomStorageReader(ck.path, other))
    finally:
        other.close()
