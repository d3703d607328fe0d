"""The transition rules with blank members (a replaced disk, mgmtd.diskident): under any
sequence of deaths, returns and disk replacements, a blank member is never serving or lastsrv,
``plan_chain`` stays at a fixed point, and the chain ends fully serving once everyone is back,
unless every member's disk was replaced (then nothing serves: the data is gone)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from loomfs.mgmtd.transitions import Member, plan_chain
from loomfs.wire.types import TargetState

S = TargetState


def _apply(ms: list[Member]) -> list[Member]:
    """One reconcile as ClusterState runs it: the plan, then restarted consumed."""
    p = plan_chain(ms)
    assert plan_chain(p.members).members == p.members  # fixed point
    for m in p.members:
        assert not (m.blank and m.state in (S.SERVING, S.LASTSRV)), m
    # (a resync reported done counts under its chain version only: any change ends it)
    return [replace(m, restarted=False, sync_done=False) for m in p.members]


def test_a_blank_only_survivor_does_not_serve_and_a_returning_member_does() -> None:
    ms = [Member(1, 1, S.SERVING, blank=True, restarted=True), Member(2, 2, S.OFFLINE, alive=False),
          Member(3, 3, S.OFFLINE, alive=False)]
    ms = _apply(ms)
    assert {m.target_id: m.state for m in ms} == {1: S.WAITING, 2: S.OFFLINE, 3: S.OFFLINE}
    ms = _apply([replace(m, alive=True) if m.target_id == 3 else m for m in ms])
    states = {m.target_id: m.state for m in ms}
    assert states[3] == S.SERVING and states[1] == S.SYNCING


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.sampled_from(["die", "return", "wipe", "sync"])),
                min_size=1, max_size=30))
def test_blank_members_never_serve_their_own_contents(steps: list[tuple[int, str]]) -> None:
    ms = [Member(i, i, S.SERVING) for i in range(3)]
    ever_full = {0, 1, 2}  # members whose disk may hold the chain's data
    for idx, kind in steps:
        def change(m: Member, idx: int = idx, kind: str = kind) -> Member:
            if m.target_id != idx:
                return m
            if kind == "die":
                return replace(m, alive=False)
            if kind == "return":
                return replace(m, alive=True, restarted=not m.alive)
            if kind == "wipe":
                return replace(m, alive=True, restarted=True, blank=True, sync_done=False)
            return replace(m, sync_done=m.state == S.SYNCING)
        if kind == "wipe":
            ever_full.discard(idx)
        ms = _apply([change(m) for m in ms])
        ever_full |= {m.target_id for m in ms if m.state == S.SERVING}
        assert sum(m.state == S.SYNCING for m in ms) <= 1
    ms = [replace(m, alive=True) for m in ms]
    for _ in range(8):
        ms = _apply([replace(m, sync_done=m.state == S.SYNCING) for m in ms])
    if ever_full:
        assert all(m.state == S.SERVING for m in ms), ms
    else:  # every disk replaced, none resynced: nothing holds the data, nothing serves
        assert not any(m.state in (S.SERVING, S.LASTSRV) for m in ms), ms
