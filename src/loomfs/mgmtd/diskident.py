"""Replaced disks (no I/O): a target whose format id changed holds none of its chain's data.

Each storage target has a format id, a random id its node created when it first formatted the
target's directory (``storage.diskident``), reported with every registration and heartbeat
(``wire.mgmtd.TargetFormat``). mgmtd keeps the last one per target (``TargetRecord.format_id``,
saved with the rest of the state: both stores, so an HA standby that takes over has it). A
target that comes back under its id with *another* format id had its disk replaced, wiped or
reformatted: without this check it registered like a restarted target and, when no other
member of its chain served, was kept serving its empty disk as the chain's copy (the gap the
session-15 notes of docs/fault-tolerance.md left open).

Such a target, while in a chain, is marked ``blank``: the transition rules never make it SERVING
or LASTSRV from its own contents (``transitions``, rule 0 and rule 4); it waits, resyncs from a
serving member like a returning target and serves once that resync finished (``blank`` is
cleared then, or when it leaves the chain). With no other member holding the chain's data, the
chain has no serving member: reads and writes of its chunks fail (the client's "no serving
target" error) rather than return an empty disk's "no chunk" as zeros. That is logged at error
level; ``blank_targets`` lists the targets concerned.

A chain of an EC group's table (``TableRecord.ec``, ``mgmtd.ec``) cannot resync: its blank target
is swapped for a spare at once, as a lost one is, so the chain's target id changes and meta's EC
rebuild worker regenerates the fragments onto it. A replicated chain (any replicas, 1 included)
whose members all came back blank has lost its data: it waits, serving nothing, for ever, unless
an operator accepts the loss (``accept_chain_loss``: ``loomfs admin chain accept-loss CHAIN
--yes-lose-data``), which lets one empty member serve; refused while any alive member holds data.

Upgrades: a target with no id recorded (a store from before format ids) gets the reported id
recorded as it is, unless the node says it created the id just now in an empty directory
(``formatted_now``: a new disk) while the target is in a chain: then it is blank too. A node of
older code reports no id: accepted as before (mgmtd cannot tell an empty disk from a full one).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from loomfs.errors import InvalidArgument, StatusError
from loomfs.wire.mgmtd import TargetFormat
from loomfs.wire.status import Status
from loomfs.wire.types import NodeState, TargetState

if TYPE_CHECKING:
    from loomfs.mgmtd.state import ClusterState, TargetRecord

logger = logging.getLogger(__name__)


def reported_format(formats: Iterable[TargetFormat] | None, target_id: int) -> str:
    """The format id reported for ``target_id`` ("" if none)."""
    for f in formats or ():
        if f.target_id == target_id:
            return f.format_id
    return ""


def check_formats(state: ClusterState, node_id: int, formats: Iterable[TargetFormat]) -> None:
    """Before a registration or heartbeat changes anything: EEXIST when two of the reported
    targets share a format id (one directory used twice) or a reported id is recorded for
    another target (the node's target directories swapped, or a disk moved between nodes).
    Marking them blank would resync over good copies; the operator decides (review, session 15)."""
    seen: dict[str, int] = {}
    for f in formats:
        if not f.format_id:
            continue
        other = seen.setdefault(f.format_id, f.target_id)
        if other != f.target_id:
            raise StatusError(Status.EEXIST, f"node {node_id}: targets {other} and {f.target_id} report one format "
                              f"id {f.format_id} (one directory used twice)")
    if not seen:
        return
    for t in state.targets.values():
        owner = seen.get(t.format_id) if t.format_id else None
        if owner is not None and owner != t.target_id:
            raise StatusError(Status.EEXIST, f"node {node_id}: target {owner} reports format id {t.format_id}, "
                              f"recorded for target {t.target_id} (node {t.node_id}): directories swapped or a disk "
                              "moved; put them back, or let an operator decide")


def note_formats(state: ClusterState, node_id: int, formats: Iterable[TargetFormat]) -> tuple[bool, list[int]]:
    """Compare the format ids node ``node_id`` reported with the recorded ones. Returns (a
    record changed: save it, the targets of chains found blank now: reconcile)."""
    changed = False
    blanked: list[int] = []
    for f in formats:
        tr = state.targets.get(f.target_id)
        if tr is None or tr.node_id != node_id or not f.format_id or tr.format_id == f.format_id:
            continue
        was = tr.format_id
        if tr.chain_id and (was or f.formatted_now):
            if not tr.blank:
                blanked.append(tr.target_id)
            tr.blank = True
            tr.sync_done_version = 0  # nothing it was sent before counts
            logger.error("target %d (node %d, chain %d) came back with another disk (format id %s, was %s): it "
                         "holds none of the chain's data: resynced from a serving member before it serves, never "
                         "served from its own contents", tr.target_id, node_id, tr.chain_id, f.format_id,
                         was or "none recorded; its node formatted it just now")
        elif was:
            logger.warning("spare target %d (node %d) has another disk (format id %s, was %s)", tr.target_id,
                           node_id, f.format_id, was)
        else:
            logger.info("target %d (node %d): format id %s recorded", tr.target_id, node_id, f.format_id)
        tr.format_id = f.format_id
        changed = True
    return changed, blanked


def warn_blank_chains(state: ClusterState, blanked: list[int]) -> None:
    """After the reconcile: say so, at error level, when a chain of a target just found blank has
    no serving member (no member holds its data now; it waits for one to return)."""
    for tid in blanked:
        tr = state.targets[tid]
        chain = state.chains.get(tr.chain_id)
        if chain is None:
            continue
        if not any(state.targets[t].state == TargetState.SERVING for t in chain.targets):
            others = [t for t in chain.targets if t != tid]
            logger.error("chain %d has no serving member: target %d came back empty (disk replaced) and no other "
                         "member (%s) holds the chain's data now; reads and writes of the chain fail until one "
                         "returns", chain.chain_id, tid, ", ".join(map(str, others)) or "none")


def blank_targets(state: ClusterState) -> list[int]:
    """Targets whose disk was replaced and that have not been resynced into their chain yet."""
    return sorted(t.target_id for t in state.targets.values() if t.blank)


def accept_chain_loss(state: ClusterState, chain_id: int, now_s: float, *,
                      give_up_dead: bool = False) -> tuple[int, list[int]]:
    """Operator action (the caller checked the confirmation): chain ``chain_id``, whose data is
    lost, serves again, its lost data given up. Returns (the member that serves now, the dead
    members given up). Two cases:

    * the chain's newest copy is lost (a blank LASTSRV: the disk of the member that last
      served alone was replaced; ``mgmtd.transitions`` rule 0) while members that fell behind
      it hold older data: it serves from the first of those on an alive node (the writes
      acknowledged since it fell behind are given up); the blank one resyncs from it;
    * every member lost its disk (all blank): it serves from an empty member, which is no
      longer blank; the others stay blank and resync from it.

    Refused (EBUSY) while the chain serves, and, when no newest copy is known lost, while any
    member on an alive node is not blank: it holds the chain's data and the normal rules serve
    from it (a failed or fenced one included: it may come back). A member on a dead node that
    was not found blank may hold the data too: refused unless ``give_up_dead``; then it is
    marked blank (it resyncs from the chain if it returns)."""
    chain = state.chains.get(chain_id)
    if chain is None:
        raise StatusError(Status.ENOENT, f"no chain {chain_id}")
    members = [state.targets[t] for t in chain.targets]

    def alive(t: TargetRecord) -> bool:
        n = state.nodes.get(t.node_id)
        return n is not None and n.state == NodeState.ALIVE

    def usable(t: TargetRecord) -> bool:
        return alive(t) and not t.failed and t.fenced_until_s <= now_s

    if any(t.state == TargetState.SERVING for t in members):
        raise StatusError(Status.EBUSY, f"chain {chain_id} serves: nothing to accept")
    markers = [t for t in members if t.blank and t.state == TargetState.LASTSRV]
    holding = [t for t in members if not t.blank and alive(t)]
    if holding and not markers:
        raise StatusError(Status.EBUSY, f"chain {chain_id}: member(s) {[t.target_id for t in holding]} on alive "
                                        "nodes hold its data (not blank): nothing to accept, the chain serves from them")
    dead = [t.target_id for t in members if not t.blank and not alive(t)]
    if dead and not give_up_dead and not (holding and markers):
        raise StatusError(Status.EBUSY, f"chain {chain_id}: member(s) {dead} on dead nodes were not found blank and "
                                        "may hold its data if they come back; give them up too explicitly")
    if holding:  # the newest copy is gone; an older one is here
        choices = [t for t in holding if usable(t)]
        given_up: list[int] = []
    else:
        choices = [t for t in members if t.blank and usable(t)]
        given_up = dead
    if not choices:
        raise InvalidArgument(f"chain {chain_id}: no alive, usable (not failed, not fenced) member to serve from")
    for tid in given_up:
        t = state.targets[tid]
        t.blank = True
        t.sync_done_version = 0
    for t in markers:  # the loss is accepted: no marker holds the chain back any more
        t.state = TargetState.WAITING if alive(t) else TargetState.OFFLINE
    chosen = choices[0]
    chosen.blank = False
    if chosen.state in (TargetState.LASTSRV, TargetState.WAITING, TargetState.OFFLINE):
        chosen.state = TargetState.WAITING  # rule 4 serves it: the chain's first alive member not blank
    state.accepted_losses += 1
    what = ("its newest copy was lost with a replaced disk; the writes acknowledged since this member fell "
            "behind are gone" if holding else "every member lost its disk" +
            (f" or is given up (dead: {given_up})" if given_up else "") + "; chunks written before are gone")
    logger.error("chain %d: the operator accepted the loss of its data: %s; target %d (node %d) serves the chain "
                 "from now on, its other members resync from it (%d chain(s) accepted as lost so far)", chain_id,
                 what, chosen.target_id, chosen.node_id, state.accepted_losses)
    state.reconcile(now_s)
    return chosen.target_id, given_up
