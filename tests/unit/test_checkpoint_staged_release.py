"""Which staged copy an async save releases once written (review of 1cf28ef, finding 1): each
save releases its own copy, found from the objects its planner was set up with, not from the
storages ``resolve_data`` answers (a planner that casts answers new tensors) nor from the
items of this rank's plan (a rank may write only byte items). Each test failed on 1cf28ef."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from test_checkpoint_save_races import LocalFS
from torch.distributed.checkpoint import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import SavePlan, WriteItem, WriteItemType

from loomfs.checkpoint import LoomStorageReader, LoomStorageWriter
from loomfs.checkpoint._format import PlanInfo
from loomfs.checkpoint._staging import Stager


class CastingPlanner(DefaultSavePlanner):
    """Saves tensors as bf16: ``resolve_data`` answers a new tensor (as dtype-casting planners do)."""

    def resolve_data(self, write_item: WriteItem) -> Any:
        obj = super().resolve_data(write_item)
        return obj.to(torch.bfloat16) if isinstance(obj, torch.Tensor) else obj


def test_a_planner_that_casts_releases_each_saves_copy(tmp_path: Path) -> None:
    fs = LocalFS(tmp_path)
    fs.makedirs("/run")
    stager = Stager()
    w = LoomStorageWriter("/run", fs, step=0, stager=stager)
    sd = {"w": torch.randn(1 << 12), "b": torch.randn(16)}
    for step in range(1, 5):
        w.step = step
        staged = w.stage(sd)  # what dcp.async_save does first
        dcp.save(staged, storage_writer=w, planner=CastingPlanner(), no_dist=True)
        assert not w._staged, f"save {step} kept its staged copy busy"
    assert (stager.allocated_total, stager.reused_total) == (1, 3)  # one copy, reused by every later save
    got = {"w": torch.zeros(1 << 12, dtype=torch.bfloat16), "b": torch.zeros(16, dtype=torch.bfloat16)}
    dcp.load(got, storage_reader=LoomStorageReader("/run", fs), no_dist=True)
    assert torch.equal(got["w"], sd["w"].to(torch.bfloat16))


def test_a_rank_with_only_byte_items_releases_its_own_copy_of_two(tmp_path: Path) -> None:
    fs = LocalFS(tmp_path)
    fs.makedirs("/run/.staging-s")
    stager = Stager()
    w = LoomStorageWriter("/run", fs, step=1, stager=stager)
    a = w.stage({"w": torch.ones(8), "meta": 1})
    b = w.stage({"w": torch.ones(8), "meta": 1})  # a second save staged before the first wrote
    assert len(w._staged) == 2
    item = WriteItem(index=MetadataIndex("meta"), type=WriteItemType.BYTE_IO)
    info = PlanInfo(rank=1, world_size=2, staging="/run/.staging-s", final="/run/step-000001-x")
    # save A on a rank whose plan holds no tensor (DCP gave "w" to the other rank); the planner
    # was set up with A's whole staged state_dict, as on every rank
    planner = SimpleNamespace(state_dict=dict(a), resolve_data=lambda i: io.BytesIO(b"1"))
    w.write_data(SavePlan([item], storage_data=info), planner)  # type: ignore[arg-type]
    assert len(w._staged) == 1  # B's copy is still being written
    c = w.stage({"w": torch.ones(8), "meta": 1})
    assert c["w"].data_ptr() == a["w"].data_ptr() != b["w"].data_ptr()  # A's copy, reused
    w.close()
    assert not w._staged


def test_a_sync_save_does_not_release_a_staged_async_copy(tmp_path: Path) -> None:
    fs = LocalFS(tmp_path)
    fs.makedirs("/run")
    w = LoomStorageWriter("/run", fs, step=1, stager=Stager())
    w.stage({"w": torch.ones(8)})  # an async save staged, not written yet
    dcp.save({"w": torch.zeros(8)}, storage_writer=w, no_dist=True)  # a sync save of other tensors
    assert len(w._staged) == 1
    w.close()
