"""The transition rules with blank members (a replaced disk, mgmtd.diskident): under any
sequence of deaths, returns and disk replacements, a blank member never serves, no member
behind the chain's newest copy is served, ``plan_chain`` stays at a fixed point, and the chain
ends fully serving once everyone is back, unless the newest copy's disks were all replaced
(then nothing serves: the chain waits for an operator's accept-loss)."""

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
        assert not (m.blank and m.state == S.SERVING), m
    # (a resync reported done counts under its chain version only: any change ends it)
    return [replace(m, restarted=False, sync_done=False) for m in p.members]


def test_a_blank_only_survivor_does_not_serve_and_a_member_behind_it_does_not_either() -> None:
    """The only serving member's disk was replaced: the chain's newest copy is gone. It becomes
    the blank lastsrv (the loss's marker), and a member that was offline while it served alone
    (behind it) is not served in its place: it waits for an operator's accept-loss (review,
    session 15: it served, dropping the writes acked meanwhile)."""
    ms = [Member(1, 1, S.SERVING, blank=True, restarted=True), Member(2, 2, S.OFFLINE, alive=False),
          Member(3, 3, S.OFFLINE, alive=False)]
    ms = _apply(ms)
    assert {m.target_id: m.state for m in ms} == {1: S.LASTSRV, 2: S.OFFLINE, 3: S.OFFLINE}
    ms = _apply([replace(m, alive=True) if m.target_id == 3 else m for m in ms])
    states = {m.target_id: m.state for m in ms}
    assert states[3] == S.WAITING and states[1] == S.LASTSRV and not any(m.state == S.SERVING for m in ms)


def test_a_blank_member_beside_a_serving_one_resyncs() -> None:
    ms = [Member(1, 1, S.SERVING, blank=True, restarted=True), Member(2, 2, S.SERVING)]
    ms = _apply(ms)
    assert {m.target_id: m.state for m in ms} == {2: S.SERVING, 1: S.WAITING}  # one round: restarted
    ms = _apply(ms)
    assert {m.target_id: m.state for m in ms} == {2: S.SERVING, 1: S.SYNCING}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.sampled_from(["die", "return", "wipe", "sync"])),
                min_size=1, max_size=30))
def test_blank_members_never_serve_and_no_member_behind_the_newest_copy_does(steps: list[tuple[int, str]]) -> None:
    """Writes are acknowledged whenever a member serves: the serving members then hold the
    newest copy (``newest``). A member becomes SERVING only by a finished resync or when it
    holds the newest copy; a wipe takes a member's copy away. Once everyone is back the chain
    ends fully serving, unless no member holds the newest copy any more (then nothing serves:
    the chain waits for an operator)."""
    ms = [Member(i, i, S.SERVING) for i in range(3)]
    newest = {0, 1, 2}  # members holding every acknowledged write
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
            newest.discard(idx)
        before = {m.target_id: m for m in (change(m) for m in ms)}
        ms = _apply(list(before.values()))
        for m in ms:
            was = before[m.target_id]
            if m.state == S.SERVING and was.state != S.SERVING:
                assert m.target_id in newest or (was.state == S.SYNCING and was.sync_done), (m, newest)
        serving = {m.target_id for m in ms if m.state == S.SERVING}
        if serving:
            newest = serving  # writes acknowledged from here on reach the serving members only
        assert sum(m.state == S.SYNCING for m in ms) <= 1
    ms = [replace(m, alive=True) for m in ms]
    for _ in range(8):
        ms = _apply([replace(m, sync_done=m.state == S.SYNCING) for m in ms])
    if newest:
        assert all(m.state == S.SERVING for m in ms), (ms, newest)
    else:  # the newest copy's disks were all replaced: nothing serves, the chain waits
        assert not any(m.state == S.SERVING for m in ms), ms
