"""Checkpoint naming and retention rules, without a cluster."""

from __future__ import annotations

import pytest

from loomfs.checkpoint import _layout as L
from loomfs.checkpoint._retention import plan_prune


def ck(step: int, complete: bool = True, stamp: str = "20261202T101500Z") -> L.CheckpointInfo:
    name = L.step_name(step, stamp)
    return L.CheckpointInfo(name, step, stamp, f"/run/{name}", complete)


def test_names_parse_back() -> None:
    name = L.step_name(123, "20261202T101500Z")
    assert name == "step-000123-20261202T101500Z" and L.parse_step(name) == 123
    assert L.parse_staging_step(L.staging_name(name)) == 123
    assert L.parse_step("latest") is None and L.parse_step(".staging-" + name) is None
    assert L.join("/run", "a", "b") == "/run/a/b" and L.join("/", "x") == "/x"
    with pytest.raises(ValueError):
        L.step_name(-1)


def test_keep_last_and_every_kth() -> None:
    cks = [ck(s) for s in range(100, 1100, 100)]  # 100..1000
    plan = plan_prune(cks, keep_last=2, keep_every=500)
    assert [L.parse_step(n) for n in plan.keep] == [500, 900, 1000]
    assert [L.parse_step(n) for n in plan.delete] == [100, 200, 300, 400, 600, 700, 800]


def test_latest_is_kept_and_incomplete_newer_ones_are_left_alone() -> None:
    cks = [ck(1), ck(2), ck(3), ck(4, complete=False), ck(5, complete=False, stamp="20270101T000000Z")]
    plan = plan_prune(cks, keep_last=1, latest=cks[0].name)
    assert plan.keep == [cks[0].name, cks[2].name, cks[3].name, cks[4].name]
    assert plan.delete == [cks[1].name]
    old_partial = [ck(1, complete=False), ck(2)]
    assert plan_prune(old_partial, keep_last=1).delete == [old_partial[0].name]
    with pytest.raises(ValueError):
        plan_prune(cks, keep_last=0)


def test_kept_checkpoints_older_than_the_last_n_are_the_ones_archived() -> None:
    cks = [ck(s) for s in range(100, 1100, 100)]
    plan = plan_prune(cks, keep_last=2, keep_every=500)
    assert [L.parse_step(n) for n in plan.archive] == [500]  # 900, 1000 stay hot (replicated)
    plan = plan_prune(cks, keep_last=1, keep_every=300, latest=cks[-2].name)
    assert [L.parse_step(n) for n in plan.archive] == [300, 600]  # latest (900) and 1000 stay
