"""torch.distributed.checkpoint on LoomFS: dcp.save/load/async_save round trips (1 and 2 ranks,
bitwise), the run layout and ``latest``, tiered saves through a local directory, retention and
verify, and the ``loomfs ckpt`` CLI."""

from __future__ import annotations

import copy
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch import nn

import loomfs
from loomfs.checkpoint import (
    LoomStorageReader,
    LoomStorageWriter,
    Stager,
    Uploader,
    list_checkpoints,
    prune,
    read_latest,
    verify,
)
from loomfs.checkpoint import _layout as L
from loomfs.checkpoint._writer import CHUNK_BYTES
from loomfs.cli.main import main
from loomfs.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def make_state(seed: int) -> dict[str, object]:
    """A small transformer's model + Adam state after one step, from ``seed``."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Embedding(64, 32), nn.TransformerEncoderLayer(32, 4, 64, batch_first=True),
                          nn.Linear(32, 64))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randint(0, 64, (4, 8))
    model(x).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optim": opt.state_dict(), "extra": {"step": seed, "name": "run"},
            "bf16": torch.randn(17, 3).to(torch.bfloat16), "scalar": torch.tensor(seed)}


def flatten(d: object, prefix: str = "") -> dict[str, object]:
    if isinstance(d, dict):
        out: dict[str, object] = {}
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    if isinstance(d, list | tuple):
        return flatten(dict(enumerate(d)), prefix)
    return {prefix: d}


def assert_same(a: object, b: object) -> None:
    fa, fb = flatten(a), flatten(b)
    assert fa.keys() == fb.keys()
    for k, va in fa.items():
        vb = fb[k]
        if isinstance(va, torch.Tensor):
            assert isinstance(vb, torch.Tensor) and va.dtype == vb.dtype and va.shape == vb.shape, k
            assert torch.equal(va.view(-1).view(torch.uint8), vb.view(-1).view(torch.uint8)), k
        else:
            assert va == vb, k


def test_save_load_single_process_bitwise(fs: loomfs.LoomFS, base: str) -> None:
    run = f"{base}/run"
    state = make_state(1)
    dcp.save(state, storage_writer=LoomStorageWriter(run, fs, step=7))
    (ck,) = list_checkpoints(fs, run)
    assert ck.step == 7 and ck.complete and read_latest(fs, run) == ck.name
    assert L.list_staging(fs, run) == []
    names = fs.listdir(ck.path)
    assert ".metadata" in names and "loomfs-checkpoint.json" in names
    assert 1 <= sum(n.endswith(".distcp") for n in names) <= 4
    # acked = fsynced on every replica (issue 10: the staging directory's durable layout flag)
    assert all(fs.get_layout(f"{ck.path}/{n}").durable for n in names if n.endswith(".distcp"))
    # bigger chunks than the default: less fixed per-chunk work on every replica
    assert all(fs.get_layout(f"{ck.path}/{n}").chunk_size == CHUNK_BYTES for n in names if n.endswith(".distcp"))

    target = make_state(2)
    reader = LoomStorageReader(run, fs, verify=True)
    dcp.load(target, storage_reader=reader)
    assert reader.checkpoint_path == ck.path
    assert_same(state, target)
    assert verify(fs, run).errors == []


def test_latest_moves_forward_and_explicit_dir(fs: loomfs.LoomFS, base: str) -> None:
    run = f"{base}/run"
    for step in (1, 2):
        dcp.save(make_state(step), storage_writer=LoomStorageWriter(run, fs, step=step))
    latest = read_latest(fs, run)
    assert latest is not None and L.parse_step(latest) == 2
    got = make_state(9)
    dcp.load(got, storage_reader=LoomStorageReader(run, fs))
    assert_same(make_state(2), got)
    first = list_checkpoints(fs, run)[0].path
    dcp.load(got, storage_reader=LoomStorageReader(first, fs))
    assert_same(make_state(1), got)
    # a plain directory checkpoint, named by dcp.save's checkpoint_id
    dcp.save(make_state(3), checkpoint_id=f"{base}/plain", storage_writer=LoomStorageWriter(f"{base}/x", fs))
    dcp.load(got, checkpoint_id=f"{base}/plain", storage_reader=LoomStorageReader(f"{base}/y", fs))
    assert_same(make_state(3), got)


def test_async_save(fs: loomfs.LoomFS, base: str) -> None:
    run = f"{base}/run"
    state = make_state(3)
    fut = dcp.async_save(state, storage_writer=LoomStorageWriter(run, fs, step=3))
    fut.result(timeout=60)
    got = make_state(4)
    dcp.load(got, storage_reader=LoomStorageReader(run, fs))
    assert_same(state, got)


def test_async_saves_reuse_the_staged_copy_while_training_goes_on(fs: loomfs.LoomFS, base: str) -> None:
    """Each async save holds the state as it was when async_save returned, although the live
    state changes while it uploads; the second save copies into the first one's memory."""
    run = f"{base}/run"
    stager = Stager()
    state = make_state(5)
    for step in (1, 2):
        fut = dcp.async_save(state, storage_writer=LoomStorageWriter(run, fs, step=step, stager=stager))
        expected = copy.deepcopy(state)
        for v in flatten(state).values():  # the training step goes on during the upload
            if isinstance(v, torch.Tensor) and v.is_floating_point():
                v.add_(1.0)
        fut.result(timeout=60)
        got = make_state(0)
        dcp.load(got, storage_reader=LoomStorageReader(run, fs))
        assert_same(expected, got)
    assert (stager.allocated_total, stager.reused_total) == (1, 1)


def test_items_across_chunk_boundaries_round_trip(fs: loomfs.LoomFS, base: str) -> None:
    """Items bigger than a chunk and at offsets that are not chunk-aligned are read in
    pieces (two in flight) straight into their tensors, bitwise."""
    run = f"{base}/run"
    g = torch.Generator().manual_seed(9)
    state = {"a": torch.rand(3 << 18, generator=g), "b": torch.rand((5 << 18) + 7, generator=g),
             "c": torch.randint(0, 255, (1001,), dtype=torch.uint8, generator=g), "d": torch.rand(9 << 18, generator=g)}
    # chunk_size=None: the run directory's chunks (4 MiB by default), which the items cross
    dcp.save(state, storage_writer=LoomStorageWriter(run, fs, step=1, files_per_rank=2, chunk_size=None))
    (ck,) = list_checkpoints(fs, run)
    assert all(fs.get_layout(f"{ck.path}/{n}").chunk_size == 4 << 20 for n in fs.listdir(ck.path) if n.endswith(".distcp"))
    got = {k: torch.zeros_like(v) for k, v in state.items()}
    dcp.load(got, storage_reader=LoomStorageReader(run, fs, inflight=2, batch_bytes=8 << 20, verify=True))
    assert all(torch.equal(state[k], got[k]) for k in state)


def test_tiered_save_through_local_dir(fs: loomfs.LoomFS, base: str, tmp_path: Path) -> None:
    run = f"{base}/run"
    up = Uploader(max_inflight=1)
    for step in (10, 20):
        w = LoomStorageWriter(run, fs, step=step, local_dir=tmp_path, uploader=up)
        dcp.save(make_state(step), storage_writer=w)
    up.wait(timeout_s=60)
    assert [c.step for c in list_checkpoints(fs, run)] == [10, 20]
    assert all(p.done and p.error is None and p.bytes_done == p.bytes_total > 0 for p in up.progress())
    assert os.listdir(tmp_path) == []
    got = make_state(0)
    dcp.load(got, storage_reader=LoomStorageReader(run, fs))
    assert_same(make_state(20), got)


def test_retention_and_cli(fs: loomfs.LoomFS, base: str, cluster: LocalCluster,
                           capsys: pytest.CaptureFixture[str]) -> None:
    run = f"{base}/run"
    state = {"w": torch.arange(10.0)}
    for step in range(1, 8):
        dcp.save(state, storage_writer=LoomStorageWriter(run, fs, step=step))
    fs.mkdir(f"{run}/{L.staging_name(L.step_name(8))}")  # a crashed save
    plan = prune(fs, run, keep_last=2, keep_every=3, dry_run=True, staging_age_s=0)
    assert [L.parse_step(n) for n in plan.keep] == [3, 6, 7]
    assert len(plan.delete) == 5 and plan.delete[-1].startswith(".staging-")
    assert len(list_checkpoints(fs, run)) == 7  # dry run

    args = ["-C", str(cluster.root), "ckpt"]
    assert main([*args, "prune", f"loom:{run}", "--keep-last", "2", "--keep-every", "3", "--staging-age", "0"]) == 0
    assert [c.step for c in list_checkpoints(fs, run)] == [3, 6, 7] and L.list_staging(fs, run) == []
    capsys.readouterr()
    assert main([*args, "ls", f"loom:{run}"]) == 0
    out = capsys.readouterr().out
    assert out.count("step-") == 3 and "latest" in out
    assert main([*args, "show", f"loom:{run}"]) == 0
    assert '"step": 7' in capsys.readouterr().out
    assert main([*args, "verify", f"loom:{run}"]) == 0
    # a flipped byte is found
    ck = list_checkpoints(fs, run)[-1].path
    data_file = next(n for n in fs.listdir(ck) if n.endswith(".distcp"))
    with fs.open(f"{ck}/{data_file}", "r+b") as f:
        b = f.read(1)
        f.seek(0)
        f.write(bytes([b[0] ^ 0xFF]))
    assert main([*args, "verify", f"loom:{run}"]) == 1
    assert "crc32c" in capsys.readouterr().out
    assert main([*args, "rm", f"loom:{ck}"]) == 0
    assert [c.step for c in list_checkpoints(fs, run)] == [3, 6]


# --- 2 ranks over gloo ---------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _full(seed: int) -> torch.Tensor:
    return torch.randn(64, 48, generator=torch.Generator().manual_seed(seed))


def _rank_main(rank: int, world: int, port: int, cluster_dir: str, run: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    fs = loomfs.connect(cluster_dir)
    try:
        state = make_state(5)  # replicated: DCP deduplicates it over the ranks' plans
        dcp.save(state, storage_writer=LoomStorageWriter(run, fs, step=5))
        fut = dcp.async_save(make_state(6), storage_writer=LoomStorageWriter(run, fs, step=6))
        fut.result(timeout=60)
        got = make_state(7)
        dcp.load(got, storage_reader=LoomStorageReader(run, fs))
        assert_same(make_state(6), got)
        # resharding: each rank writes only its rows of w and its columns of v ...
        mesh = init_device_mesh("cpu", (world,))
        sharded = {"w": distribute_tensor(_full(1), mesh, [Shard(0)]),
                   "v": distribute_tensor(_full(2), mesh, [Shard(1)])}
        dcp.save(sharded, storage_writer=LoomStorageWriter(f"{run}-sharded", fs, step=1))
        # ... and a checkpoint one process wrote (the test, before) loads as shards of another split
        mine = {"w": distribute_tensor(torch.zeros(64, 48), mesh, [Shard(1)])}
        dcp.load(mine, storage_reader=LoomStorageReader(f"{run}-one", fs))
        assert torch.equal(mine["w"].to_local(), _full(3).chunk(world, dim=1)[rank])
        dist.barrier()
    finally:
        fs.close()
        dist.destroy_process_group()


def test_two_ranks_gloo(fs: loomfs.LoomFS, base: str, cluster: LocalCluster) -> None:
    """Two ranks: save, async save, load; and resharding (issue 10 item 5): tensors sharded over
    the 2 ranks load whole in one process, and one process's checkpoint loads as shards."""
    run = f"{base}/run"
    dcp.save({"w": _full(3)}, storage_writer=LoomStorageWriter(f"{run}-one", fs, step=1))
    mp.spawn(_rank_main, args=(2, _free_port(), str(cluster.root), run), nprocs=2, join=True)
    cks = list_checkpoints(fs, run)
    assert [c.step for c in cks] == [5, 6] and all(c.complete for c in cks)
    names = fs.listdir(cks[-1].path)
    assert any(n.startswith("__0_") for n in names) and any(n.startswith("__1_") for n in names)
    got = make_state(8)
    dcp.load(got, storage_reader=LoomStorageReader(run, fs, verify=True))
    assert_same(make_state(6), got)
    names = fs.listdir(list_checkpoints(fs, f"{run}-sharded")[-1].path)
    assert any(n.startswith("__0_") for n in names) and any(n.startswith("__1_") for n in names)
    whole = {"w": torch.zeros(64, 48), "v": torch.zeros(64, 48)}
    dcp.load(whole, storage_reader=LoomStorageReader(f"{run}-sharded", fs, verify=True))
    assert torch.equal(whole["w"], _full(1)) and torch.equal(whole["v"], _full(2))
