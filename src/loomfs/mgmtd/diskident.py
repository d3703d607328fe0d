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
whose members all came back blank has lost its data: it waits, serving nothing.

Upgrades: a target with no id recorded (a store from before format ids) gets the reported id
recorded as it is, unless the node says it created the id just now in an empty directory
(``formatted_now``: a new disk) while the target is in a chain: then it is blank too. A node of
older code reports no id: accepted as before (mgmtd cannot tell an empty disk from a full one).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from loomfs.wire.mgmtd import TargetFormat
from loomfs.wire.types import TargetState

if TYPE_CHECKING:
    from loomfs.mgmtd.state import ClusterState

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
