"""CRAQ decisions (storage.chain): every role x version state x event."""

from __future__ import annotations

import itertools

import pytest

from loomfs.storage import chain
from loomfs.storage.chain import (
    AckCommitted,
    Apply,
    Commit,
    Position,
    ReadIn,
    Reforward,
    Refuse,
    Role,
    Serve,
    UpdateIn,
    Versions,
    on_read,
    on_remove,
    on_successor_result,
    on_update,
    position_of,
)
from loomfs.wire.status import Status

CHAIN = (101, 201, 301)
V = 4  # chain version


def pos(target: int, targets: tuple[int, ...] = CHAIN) -> Position:
    p = position_of(9, V, targets, target)
    assert p is not None
    return p


ROLES = {
    Role.HEAD: pos(101),
    Role.MIDDLE: pos(201),
    Role.TAIL: pos(301),
    Role.SINGLE: pos(101, (101,)),
}


def test_positions() -> None:
    assert [(p.role, p.predecessor, p.successor) for p in ROLES.values()] == [
        (Role.HEAD, None, 201),
        (Role.MIDDLE, 101, 301),
        (Role.TAIL, 201, None),
        (Role.SINGLE, None, None),
    ]
    assert pos(201, (101, 201)).role is Role.TAIL
    assert position_of(9, V, CHAIN, 999) is None


@pytest.mark.parametrize("role", list(Role))
@pytest.mark.parametrize("forwarded", [False, True])
def test_stale_chain_version_refused_everywhere(role: Role, forwarded: bool) -> None:
    for version in (V - 1, V + 1, 0):
        acts = on_update(ROLES[role], Versions(3), UpdateIn(version, forwarded, 4))
        assert acts == [Refuse(Status.STALE_CHAIN_VERSION, acts[0].reason)]  # type: ignore[union-attr]
        r = on_read(ROLES[role], Versions(3), ReadIn(version))
        assert isinstance(r, Refuse) and r.status is Status.STALE_CHAIN_VERSION
        rm = on_remove(ROLES[role], UpdateIn(version, forwarded))
        assert isinstance(rm[0], Refuse) and rm[0].status is Status.STALE_CHAIN_VERSION


def test_not_a_member() -> None:
    for acts in (on_update(None, Versions(), UpdateIn(V)), on_remove(None, UpdateIn(V))):
        assert isinstance(acts[0], Refuse) and acts[0].status is Status.TARGET_NOT_SERVING
    r = on_read(None, Versions(), ReadIn(V))
    assert isinstance(r, Refuse) and r.status is Status.TARGET_NOT_SERVING


@pytest.mark.parametrize("role", [Role.MIDDLE, Role.TAIL])
def test_client_write_to_non_head(role: Role) -> None:
    acts = on_update(ROLES[role], Versions(1), UpdateIn(V))
    assert len(acts) == 1 and isinstance(acts[0], Refuse) and acts[0].status is Status.NOT_HEAD
    rm = on_remove(ROLES[role], UpdateIn(V))
    assert isinstance(rm[0], Refuse) and rm[0].status is Status.NOT_HEAD


@pytest.mark.parametrize("role", [Role.HEAD, Role.SINGLE])
def test_forwarded_to_head_is_refused(role: Role) -> None:
    acts = on_update(ROLES[role], Versions(1), UpdateIn(V, True, 2))
    assert isinstance(acts[0], Refuse) and acts[0].status is Status.STALE_CHAIN_VERSION


@pytest.mark.parametrize("committed", [0, 1, 7])
def test_head_assigns_next_version_and_forwards(committed: int) -> None:
    assert on_update(ROLES[Role.HEAD], Versions(committed), UpdateIn(V)) == [Apply(committed + 1, 201)]
    assert on_update(ROLES[Role.SINGLE], Versions(committed), UpdateIn(V)) == [Apply(committed + 1, None)]


def test_head_reforwards_leftover_pending_first() -> None:
    acts = on_update(ROLES[Role.HEAD], Versions(3, 4), UpdateIn(V))
    assert acts == [Reforward(4, 201), Apply(5, 201)]


def test_single_commits_leftover_pending() -> None:
    """Issue 8 defect 3: the only member holding a leftover pending version commits it (the
    old tail may have committed and served it) before assigning the next version."""
    assert on_update(ROLES[Role.SINGLE], Versions(3, 4), UpdateIn(V)) == [Reforward(4, None), Apply(5, None)]


def test_client_retry_dedupe_by_chunk_tags() -> None:
    """Issue 8 defect 4: a retried request whose tag is on the chunk is not applied again."""
    head = ROLES[Role.HEAD]
    assert on_update(head, Versions(3), UpdateIn(V, seen=chain.TagSeen.COMMITTED)) == [AckCommitted(3)]
    # on the pending version: push it down, then answer (never a second version)
    assert on_update(head, Versions(3, 4), UpdateIn(V, seen=chain.TagSeen.PENDING)) == [
        Reforward(4, 201), AckCommitted(4)]
    assert on_update(ROLES[Role.SINGLE], Versions(3, 4), UpdateIn(V, seen=chain.TagSeen.PENDING)) == [
        Reforward(4, None), AckCommitted(4)]


@pytest.mark.parametrize("role", [Role.MIDDLE, Role.TAIL])
def test_duplicate_with_other_content_is_refused(role: Role) -> None:
    """Issue 8 defect 1: a forwarded "duplicate" is acked only when its content matches."""
    p = ROLES[role]
    local = Versions(5, 0, length=100, crc=0xAB)
    assert on_update(p, local, UpdateIn(V, True, 5, expect_length=100, expect_crc=0xAB)) == [AckCommitted(5)]
    bad = on_update(p, local, UpdateIn(V, True, 5, expect_length=100, expect_crc=0xCD))
    assert isinstance(bad[0], Refuse) and bad[0].status is Status.VERSION_MISMATCH
    # the sender's whole-chunk replace repairs it in place
    succ = p.successor
    assert on_update(p, local, UpdateIn(V, True, 5, True, expect_length=100, expect_crc=0xCD)) == [
        Apply(5, succ, repair=True)]
    # never backwards
    old = on_update(p, local, UpdateIn(V, True, 4, True, expect_length=100, expect_crc=0xAB))
    assert isinstance(old[0], Refuse) and old[0].status is Status.VERSION_MISMATCH


@pytest.mark.parametrize("role", [Role.MIDDLE, Role.TAIL])
def test_forwarded_rules(role: Role) -> None:
    p = ROLES[role]
    succ = 301 if role is Role.MIDDLE else None
    # a duplicate of the committed version is acked idempotently; an older one is refused
    assert on_update(p, Versions(5), UpdateIn(V, True, 5)) == [AckCommitted(5)]
    old = on_update(p, Versions(5), UpdateIn(V, True, 1))
    assert isinstance(old[0], Refuse) and old[0].status is Status.VERSION_MISMATCH
    # the next version applies, pending or not (a re-forward replaces the pending update)
    assert on_update(p, Versions(5), UpdateIn(V, True, 6)) == [Apply(6, succ)]
    assert on_update(p, Versions(5, 6), UpdateIn(V, True, 6)) == [Apply(6, succ)]
    # a gap is a version mismatch unless it is a whole-chunk replace
    gap = on_update(p, Versions(5), UpdateIn(V, True, 8))
    assert isinstance(gap[0], Refuse) and gap[0].status is Status.VERSION_MISMATCH
    assert on_update(p, Versions(5), UpdateIn(V, True, 8, full_replace=True)) == [Apply(8, succ)]
    assert on_update(p, Versions(0), UpdateIn(V, True, 1)) == [Apply(1, succ)]


def test_exhaustive_update_invariants() -> None:
    """Over all roles, local states and events: replies are well formed, versions never
    go backwards and a client write is applied only at the head."""
    for role, (committed, pending_delta), (forwarded, upd, full) in itertools.product(
        list(Role), itertools.product(range(4), (0, 1)), itertools.product((False, True), range(6), (False, True))
    ):
        local = Versions(committed, committed + pending_delta if pending_delta else 0)
        p = ROLES[role]
        acts = on_update(p, local, UpdateIn(V, forwarded, upd, full))
        assert acts, (role, local)
        applies = [a for a in acts if isinstance(a, Apply)]
        if isinstance(acts[0], Refuse | AckCommitted):
            assert len(acts) == 1
            continue
        assert len(applies) == 1 and acts[-1] is applies[0]
        a = applies[0]
        assert a.update_ver > committed or (a.repair and a.update_ver == committed)
        assert a.successor == p.successor
        if not forwarded:
            assert p.is_head
            assert a.update_ver == max(committed, local.pending_ver) + 1
        else:
            assert a.update_ver == upd
        for r in acts[:-1]:
            assert isinstance(r, Reforward) and r.update_ver == local.pending_ver < a.update_ver


@pytest.mark.parametrize("role", list(Role))
def test_reads(role: Role) -> None:
    p = ROLES[role]
    assert on_read(p, Versions(3), ReadIn(V)) == Serve()
    assert on_read(p, Versions(0), ReadIn(V)) == Serve()  # missing chunk: served as "not exists"
    r = on_read(p, Versions(3, 4), ReadIn(V))
    if p.is_tail:
        assert r == chain.Settle(4)  # issue 8 defect 3: commit the leftover, then serve
    else:
        assert isinstance(r, Refuse) and r.status is Status.NOT_COMMITTED


def test_successor_result() -> None:
    assert on_successor_result(7, Status.OK) == Commit(7)
    for st in (Status.STALE_CHAIN_VERSION, Status.VERSION_MISMATCH):
        r = on_successor_result(7, st)
        assert isinstance(r, Refuse) and r.status is st
    for st in (Status.CHAIN_UNAVAILABLE, Status.DEADLINE_EXCEEDED, Status.EIO, Status.SHUTTING_DOWN):
        r = on_successor_result(7, st)
        assert isinstance(r, Refuse) and r.status is Status.CHAIN_UNAVAILABLE


def test_remove_forwards_down_the_chain() -> None:
    assert on_remove(ROLES[Role.HEAD], UpdateIn(V)) == [Apply(0, 201)]
    assert on_remove(ROLES[Role.MIDDLE], UpdateIn(V, True)) == [Apply(0, 301)]
    assert on_remove(ROLES[Role.TAIL], UpdateIn(V, True)) == [Apply(0, None)]
    assert on_remove(ROLES[Role.SINGLE], UpdateIn(V)) == [Apply(0, None)]


def test_simulated_chain_converges() -> None:
    """Drive three replicas with the pure functions (no I/O): a forward that fails midway
    leaves pending state; the next head write re-forwards it and all replicas agree."""
    state = {t: Versions() for t in CHAIN}
    positions = {t: pos(t) for t in CHAIN}

    def deliver(t: int, ev: UpdateIn, fail_at: int | None) -> Status:
        acts = on_update(positions[t], state[t], ev)
        for a in acts:
            if isinstance(a, Refuse):
                return a.status
            if isinstance(a, AckCommitted):
                return Status.OK
            assert isinstance(a, Reforward | Apply)
            ver = a.update_ver
            if isinstance(a, Apply):
                state[t] = Versions(state[t].commit_ver, ver)
            if a.successor is None:
                out: chain.Action = Commit(ver)
            else:
                st = Status.CHAIN_UNAVAILABLE if a.successor == fail_at else deliver(
                    a.successor, UpdateIn(V, True, ver, isinstance(a, Reforward)), fail_at
                )
                out = on_successor_result(ver, st)
            if isinstance(out, Refuse):
                return out.status
            assert isinstance(out, Commit)
            state[t] = Versions(out.update_ver, 0)
        return Status.OK

    assert deliver(101, UpdateIn(V), None) is Status.OK
    assert deliver(101, UpdateIn(V), fail_at=301) is Status.CHAIN_UNAVAILABLE
    assert state[101] == Versions(1, 2) and state[201] == Versions(1, 2) and state[301] == Versions(1)
    assert on_read(positions[201], state[201], ReadIn(V)) == Refuse(Status.NOT_COMMITTED, on_read(positions[201], state[201], ReadIn(V)).reason)  # type: ignore[union-attr]
    assert deliver(101, UpdateIn(V), None) is Status.OK
    assert {t: s.commit_ver for t, s in state.items()} == {101: 3, 201: 3, 301: 3}
    assert all(not s.has_pending for s in state.values())
