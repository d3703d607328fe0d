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
    """Operator action (the caller checked the confirmation): chain ``chain_id``, whose members
    all lost their disks, serves again from an empty member, its data given up. Returns (the
    member that serves now, the dead members given up). Nothing else changes: the chosen member
    is no longer blank, so the transition rules (rule 4) make it serve; the other members stay
    blank and resync from it as usual.

    Refused (EBUSY) while any member on an alive node is not blank: it holds the chain's data and
    the normal rules serve from it (a failed or fenced one included: it may come back). A member
    on a dead node that was not found blank may hold the data too: refused unless
    ``give_up_dead``; then it is marked blank (it resyncs from the chain if it returns)."""
    chain = state.chains.get(chain_id)
    if chain is None:
        raise StatusError(Status.ENOENT, f"no chain {chain_id}")
    members = [state.targets[t] for t in chain.targets]

    def alive(t: TargetRecord) -> bool:
        n = state.nodes.get(t.node_id)
        return n is not None and n.state == NodeState.ALIVE

    holding = [t.target_id for t in members if not t.blank and alive(t)]
    if holding:
        raise StatusError(Status.EBUSY, f"chain {chain_id}: member(s) {holding} on alive nodes hold its data "
                                        "(not blank): nothing to accept, the chain serves from them")
    dead = [t.target_id for t in members if not t.blank]
    if dead and not give_up_dead:
        raise StatusError(Status.EBUSY, f"chain {chain_id}: member(s) {dead} on dead nodes were not found blank and "
                                        "may hold its data if they come back; give them up too explicitly")
    usable = [t for t in members if t.blank and alive(t) and not t.failed and t.fenced_until_s <= now_s]
    if not usable:
        raise InvalidArgument(f"chain {chain_id}: no alive, usable (not failed, not fenced) member to serve from")
    for tid in dead:
        t = state.targets[tid]
        t.blank = True
        t.sync_done_version = 0
    chosen = usable[0]
    chosen.blank = False
    state.accepted_losses += 1
    logger.error("chain %d: the operator accepted the loss of its data: every member lost its disk%s; target %d "
                 "(node %d, empty) serves the chain from now on, its other members resync from it; chunks written "
                 "before are gone (%d chain(s) accepted as lost so far)", chain_id,
                 f" or is given up (dead: {dead})" if dead else "", chosen.target_id, chosen.node_id,
                 state.accepted_losses)
    state.reconcile(now_s)
    return chosen.target_id, dead
