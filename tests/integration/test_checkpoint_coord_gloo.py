"""Two ranks over gloo (two OS processes) loading one run directory while its ``latest`` moves:
the coordinator's resolution (``LoadPlan.storage_data``) is what every rank loads.

One spawn of two processes runs every case (a spawn costs seconds on the 2 shared cores); each
rank records, per case, what it loaded (a digest of every byte), the checkpoint it read, the
``_layout.resolve`` calls (and in which phase) and the ``.metadata`` files it read. The tests
below check those records:

- ``latest`` moved after the plan (a save committed between plan and read): both ranks load the
  checkpoint the coordinator shared, bitwise equal; no rank resolves again while reading (one
  resolve per rank per load, in ``read_metadata``), so the new checkpoint never reaches a read;
- ``latest`` moved between the two ranks' resolutions: rank 1 resolved the newer one and loads
  the coordinator's instead (one resolve; its second ``.metadata`` read is the coordinator's);
- the same with a newer checkpoint of another structure: every rank fails, clearly;
- a planner that drops ``storage_data`` (the coordinator's choice never reaches rank 1): the
  load fails on every rank, or loads one checkpoint on both, never one on each;
- the shared checkpoint deleted between plan and read: every rank fails before it changes a
  byte of its state_dict.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from test_checkpoint import _free_port, flatten, make_state
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.planner import LoadPlan

import loomfs
from loomfs.checkpoint import LoomStorageReader, LoomStorageWriter, list_checkpoints
from loomfs.checkpoint import _layout as L
from loomfs.checkpoint import _reader as R
from loomfs.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

LOADED_SEED = 1  # the checkpoint every rank must load
NEWER_SEED = 2  # the one committed while they load
TARGET_SEED = 7  # what the state_dict held before the load


def digest(state: object) -> str:
    """Every byte of a state_dict (tensors bitwise, other values by repr)."""
    h = hashlib.sha256()
    for key, value in sorted(flatten(state).items()):
        h.update(key.encode())
        if isinstance(value, torch.Tensor):
            h.update(str(value.dtype).encode() + str(tuple(value.shape)).encode())
            h.update(value.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            h.update(repr(value).encode())
    return h.hexdigest()


def newer_state(structure: bool) -> dict[str, object]:
    state = make_state(NEWER_SEED)
    if structure:  # another structure: one more tensor
        state["more"] = torch.ones(5)
    return state


def commit_into(fs: loomfs.LoomFS, run: str, pending: str) -> None:
    """What a save's commit does: the complete checkpoint renamed into the run, then ``latest``."""
    (ck,) = list_checkpoints(fs, pending)
    fs.rename(ck.path, L.join(run, ck.name))
    assert L.write_latest(fs, run, ck.name)


class DropStorageData(DefaultLoadPlanner):
    """A planner whose ``finish_plan`` rebuilds the plan from its items (``storage_data`` lost)."""

    def finish_plan(self, new_plan: LoadPlan) -> LoadPlan:
        return LoadPlan(items=new_plan.items)


class Recorder:
    """``_layout.resolve`` and ``.metadata`` reads of this process, with the phase they ran in."""

    def __init__(self) -> None:
        self.phase = "plan"
        self.resolves: list[str] = []
        self.metadata: list[str] = []
        real_resolve, real_read = L.resolve, R._read_metadata

        def resolve(fs: Any, path: str) -> str:
            self.resolves.append(self.phase)
            return real_resolve(fs, path)

        def read_metadata(fs: Any, ckpt: str) -> Any:
            self.metadata.append(ckpt)
            return real_read(fs, ckpt)

        L.resolve = resolve
        R._read_metadata = read_metadata

    def clear(self) -> None:
        self.phase, self.resolves, self.metadata = "plan", [], []


class Reader(LoomStorageReader):
    """``on_plan``: run on the coordinator after it chose (between plan and read). ``split``:
    rank 1 resolves only after rank 0 did and after ``on_split`` moved ``latest``."""

    def __init__(self, path: str, fs: Any, rec: Recorder, *, on_plan: Callable[[], None] | None = None,
                 on_split: Callable[[], None] | None = None) -> None:
        super().__init__(path, fs)
        self.rec, self.on_plan, self.on_split = rec, on_plan, on_split

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        if self.on_split is None:
            return super().read_metadata(*args, **kwargs)
        if dist.get_rank() == 0:
            md = super().read_metadata(*args, **kwargs)
            dist.barrier()
            return md
        dist.barrier()
        self.on_split()
        return super().read_metadata(*args, **kwargs)

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        out = super().prepare_global_plan(plans)
        if self.on_plan is not None:
            self.on_plan()
        return out

    def read_data(self, plan: LoadPlan, planner: Any) -> Any:
        self.rec.phase = "read"
        try:
            return super().read_data(plan, planner)
        finally:
            self.rec.phase = "done"


def _case(fs: loomfs.LoomFS, rec: Recorder, path: str, **kw: Any) -> dict[str, Any]:
    planner = kw.pop("planner", None)
    rec.clear()
    got = make_state(TARGET_SEED)
    reader = Reader(path, fs, rec, **kw)
    out: dict[str, Any] = {"ok": True, "error": ""}
    try:
        dcp.load(got, storage_reader=reader, planner=planner)
    except (Exception, CheckpointException) as exc:
        out.update(ok=False, error=f"{type(exc).__name__}: {exc}")
    out.update(digest=digest(got), checkpoint=reader.checkpoint_path, resolves=rec.resolves,
               metadata=rec.metadata)
    return out


def _rank_main(rank: int, world: int, port: int, cluster_dir: str, runs: dict[str, list[str]], out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    fs = loomfs.connect(cluster_dir)
    rec = Recorder()
    results: dict[str, Any] = {}

    def commit(name: str) -> Callable[[], None]:
        run, pending = runs[name][0], runs[name][1]
        return lambda: commit_into(fs, run, pending)

    def prune(name: str) -> Callable[[], None]:
        run, old = runs[name][0], runs[name][1]
        return lambda: (L.remove_aside(fs, run, old), None)[1]

    coordinator = rank == 0
    try:
        results["after_plan"] = _case(fs, rec, runs["after_plan"][0],
                                      on_plan=commit("after_plan") if coordinator else None)
        dist.barrier()
        results["split"] = _case(fs, rec, runs["split"][0], on_split=commit("split") if rank == 1 else (lambda: None))
        dist.barrier()
        results["structure"] = _case(fs, rec, runs["structure"][0],
                                     on_split=commit("structure") if rank == 1 else (lambda: None))
        dist.barrier()
        results["dropped"] = _case(fs, rec, runs["dropped"][0], planner=DropStorageData(),
                                   on_split=commit("dropped") if rank == 1 else (lambda: None))
        dist.barrier()
        results["dropped_explicit"] = _case(fs, rec, runs["dropped_explicit"][0], planner=DropStorageData())
        dist.barrier()
        results["pruned"] = _case(fs, rec, runs["pruned"][0], on_plan=prune("pruned") if coordinator else None)
        dist.barrier()
    finally:
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
        fs.close()
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Every case's records of rank 0 and rank 1 (one spawn of two processes)."""
    fs = loomfs.connect(str(cluster.root))
    base = "/t_checkpoint_coord_gloo"
    try:
        if fs.exists(base):
            fs.rmtree(base)
        runs: dict[str, list[str]] = {}
        for name in ("after_plan", "split", "structure", "dropped", "pruned"):
            run, pending = f"{base}/{name}", f"{base}/{name}-pending"
            dcp.save(make_state(LOADED_SEED), storage_writer=LoomStorageWriter(run, fs, step=1))
            if name == "pruned":
                runs[name] = [run, list_checkpoints(fs, run)[0].name]
                continue
            dcp.save(newer_state(name == "structure"), storage_writer=LoomStorageWriter(pending, fs, step=2))
            runs[name] = [run, pending]
        runs["dropped_explicit"] = [list_checkpoints(fs, runs["dropped"][0])[0].path]
        out = tmp_path_factory.mktemp("coord")
        mp.spawn(_rank_main, args=(2, _free_port(), str(cluster.root), runs, str(out)), nprocs=2, join=True)
        return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    finally:
        fs.close()


def test_latest_moved_after_the_plan_loads_the_shared_checkpoint_bitwise(ranks: list[dict[str, Any]]) -> None:
    r0, r1 = (r["after_plan"] for r in ranks)
    assert r0["ok"] and r1["ok"], (r0["error"], r1["error"])
    assert r0["digest"] == r1["digest"] == digest(make_state(LOADED_SEED))
    assert r0["checkpoint"] == r1["checkpoint"] and L.parse_step(r0["checkpoint"].rsplit("/", 1)[1]) == 1
    # one resolve per rank, in read_metadata; none once the coordinator shared its choice
    assert r0["resolves"] == r1["resolves"] == ["plan"]
    assert r0["metadata"] == r1["metadata"] == [r0["checkpoint"]]


def test_a_rank_that_resolved_a_newer_one_loads_the_coordinators(ranks: list[dict[str, Any]]) -> None:
    r0, r1 = (r["split"] for r in ranks)
    assert r0["ok"] and r1["ok"], (r0["error"], r1["error"])
    assert r0["digest"] == r1["digest"] == digest(make_state(LOADED_SEED))
    assert r0["checkpoint"] == r1["checkpoint"]
    assert r0["resolves"] == r1["resolves"] == ["plan"]
    # rank 1 read its own (the newer one) while planning, then the coordinator's, once
    assert len(r1["metadata"]) == 2 and r1["metadata"][0] != r0["checkpoint"]
    assert r1["metadata"][1] == r0["checkpoint"] and r0["metadata"] == [r0["checkpoint"]]


def test_a_newer_one_of_another_structure_fails_every_rank(ranks: list[dict[str, Any]]) -> None:
    r0, r1 = (r["structure"] for r in ranks)
    assert not r0["ok"] and not r1["ok"]
    assert "structures differ" in r0["error"] and "structures differ" in r1["error"]


def test_a_plan_without_the_coordinators_choice_never_splits_the_ranks(ranks: list[dict[str, Any]]) -> None:
    """Failed on the old code: rank 1 fell back to its own resolution (the newer checkpoint)
    while rank 0 loaded the older one."""
    r0, r1 = (r["dropped"] for r in ranks)
    if r0["ok"] and r1["ok"]:
        assert r0["digest"] == r1["digest"]
    else:
        assert not r0["ok"] and not r1["ok"]
        assert "storage_data" in r1["error"]
    # a checkpoint directory named explicitly is no choice to share: it loads without it
    e0, e1 = (r["dropped_explicit"] for r in ranks)
    assert e0["ok"] and e1["ok"], (e0["error"], e1["error"])
    assert e0["digest"] == e1["digest"] == digest(make_state(LOADED_SEED))


def test_the_shared_checkpoint_deleted_before_the_read_fails_every_rank_unchanged(ranks: list[dict[str, Any]]) -> None:
    r0, r1 = (r["pruned"] for r in ranks)
    assert not r0["ok"] and not r1["ok"]
    for r in (r0, r1):  # LoomFS's NotFound (a FileNotFoundError; it pickles as itself since fab1fbe)
        assert "FileNotFoundError" in r["error"] or "errors.NotFound" in r["error"], r["error"]
    # failed before any byte was read: the state_dicts are as they were, not a mix
    assert r0["digest"] == r1["digest"] == digest(make_state(TARGET_SEED))
