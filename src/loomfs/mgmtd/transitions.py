"""Target-state transitions of one chain: a pure function, no I/O, no clock reads.

``plan_chain`` takes the chain's members (in chain order) with their public state and what
mgmtd knows locally (is the node alive, did the target just restart, did its resync finish,
since when is it offline, is its node draining) plus the spare targets, and returns the new
member list, in routing order, with new states. mgmtd calls it on every event and every tick,
so it must reach a fixed point: calling it again on its own output changes nothing.

The rules (docs/fault-tolerance.md has them as a table):

* a dead SERVING target goes OFFLINE, unless it was the chain's last serving one: then the
  first of those in chain order goes LASTSRV (it holds the newest data) and the rest OFFLINE;
* a dead SYNCING or WAITING target goes OFFLINE; LASTSRV and OFFLINE stay;
* an alive LASTSRV serves again when the chain has no serving member, else it waits;
* an alive OFFLINE target (or a restarted SERVING one, while others serve) WAITs;
* one WAITING target at a time becomes SYNCING, when the chain has a serving member;
* a SYNCING target whose predecessor reported sync done becomes SERVING;
* a chain with no serving and no lastsrv member (nothing better is known) serves from its
  first alive member, so a chain never stays stuck;
* a *blank* member (its disk was replaced: a new format id, ``mgmtd.diskident``) holds none
  of the chain's data: it is never made SERVING from its own contents (alive, it WAITs and
  then resyncs; a resync its restart interrupted starts over) and is skipped by the rule
  above: a chain whose only alive members are blank serves nothing until a member that holds
  its data returns. A blank member that held the chain's newest copy (LASTSRV, or the only
  serving member) stays or becomes LASTSRV, blank: the loss's marker, never serving, so no
  member behind it is served in its place; the chain waits for an operator's accept-loss;
* an OFFLINE target offline for longer than ``replace_after_s`` is swapped for a spare on
  another node, which then syncs like a returning target;
* a draining target gets a spare added beside it; once the chain has ``replicas`` serving
  members without it, it leaves the chain.

Routing order: serving (keeping their order: the head stays the head), syncing, waiting,
lastsrv, offline. Writes flow through serving then syncing members, so the syncing target is
the write tail and the last serving one its predecessor (the resync source).

``pick_suspicion`` is the other per-chain rule: which of the chain's pending
"successor unreachable" reports to act on, and when (position-aware blame, below).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from loomfs.wire.types import TargetState

S = TargetState
_ORDER = {S.SERVING: 0, S.SYNCING: 1, S.WAITING: 2, S.LASTSRV: 3, S.OFFLINE: 4}


@dataclass(frozen=True, slots=True)
class Member:
    target_id: int
    node_id: int
    state: S
    alive: bool = True
    restarted: bool = False  # the node re-registered (a new process): its data may be behind
    sync_done: bool = False  # the predecessor reported the resync finished
    offline_since_s: float | None = None
    draining: bool = False
    fenced: bool = False  # alive, but reported unreachable by its predecessor (alive is False)
    failed: bool = False  # its node reported a disk failure (a failed fsync; alive is False)
    domain: str = ""  # its node's failure domain ("" = the node is a domain of its own)
    # its disk was replaced (a new format id, mgmtd.diskident): it holds none of the chain's
    # data, so it never serves from its own contents (serving, lastsrv) until a resync finished
    blank: bool = False

    @property
    def domain_key(self) -> object:
        return self.domain or ("node", self.node_id)


@dataclass(frozen=True, slots=True)
class ChainPlan:
    members: list[Member]  # new routing order with new states
    removed: list[int] = field(default_factory=list)  # targets that left the chain (now spares)
    added: list[int] = field(default_factory=list)  # spares that joined
    reasons: list[str] = field(default_factory=list)  # one line per change, for the log

    def targets(self) -> list[int]:
        return [m.target_id for m in self.members]


def _set(ms: list[Member], i: int, state: S, reasons: list[str], why: str) -> None:
    if ms[i].state != state:
        reasons.append(f"target {ms[i].target_id}: {ms[i].state.name} -> {state.name} ({why})")
        ms[i] = replace(ms[i], state=state)


def _states(ms: list[Member]) -> list[S]:
    return [m.state for m in ms]


def _why_gone(m: Member) -> str:
    if m.failed:
        return "disk failure (fsync): out of service"
    return "unreachable from its chain: fenced" if m.fenced else "lease lapsed"


def _step_states(ms: list[Member], reasons: list[str]) -> None:
    """The per-target rules, applied in place in a fixed order."""
    # 0. replaced disks: an empty target is no copy of the chain's data. It waits (then resyncs
    # from a serving member); a resync under way when its process restarted starts over. If it
    # held the chain's newest copy (lastsrv, or the only serving member), that copy is gone: it
    # stays (or becomes) lastsrv, blank, as the chain's marker of the loss, so no member that
    # was behind it is served in its place (rule 4) until an operator accepts the loss
    # (``accept_chain_loss``; review, session 15: acknowledged writes were dropped and their
    # version numbers reused for other bytes)
    for i, m in enumerate(ms):
        if not m.blank or m.state == S.LASTSRV:
            continue
        if m.state == S.SERVING:
            if not any(j != i and x.state == S.SERVING and x.alive and not x.blank for j, x in enumerate(ms)):
                _set(ms, i, S.LASTSRV, reasons, "disk replaced: the chain's newest copy is lost; "
                                                "waits for an operator to accept the loss")
            else:
                _set(ms, i, S.WAITING if m.alive else S.OFFLINE, reasons, "disk replaced: empty, resync from the chain")
        elif m.state == S.SYNCING and m.restarted and m.alive:
            _set(ms, i, S.WAITING, reasons, "disk replaced: empty, resync from the chain")
    # 1. failures
    serving_alive = [m for m in ms if m.state == S.SERVING and m.alive]
    dying = [i for i, m in enumerate(ms) if m.state == S.SERVING and not m.alive]
    has_lastsrv = S.LASTSRV in _states(ms)
    for k, i in enumerate(dying):
        # all serving members lost at once: the one furthest down the chain is the last
        # serving member (commits happen at the tail first, so it holds every acknowledged
        # version; upstream members may lack the newest ones)
        last = not serving_alive and not has_lastsrv and k == len(dying) - 1
        _set(ms, i, S.LASTSRV if last else S.OFFLINE, reasons, "last serving member lost" if last else _why_gone(ms[i]))
    for i, m in enumerate(ms):
        if not m.alive and m.state in (S.SYNCING, S.WAITING):
            _set(ms, i, S.OFFLINE, reasons, _why_gone(m))
    # 2. restarts of serving targets while others serve: their data may lag (lost pending)
    for i, m in enumerate(ms):
        others = [x for x in ms if x is not m and x.state == S.SERVING and x.alive]
        if m.alive and m.restarted and m.state == S.SERVING and others:
            _set(ms, i, S.WAITING, reasons, "restarted; resync from the chain")
    # 3. returns
    for i, m in enumerate(ms):
        if not m.alive:
            continue
        serving = S.SERVING in _states(ms)
        if m.state == S.LASTSRV and not m.blank:  # (a blank one: the loss's marker, rule 0)
            _set(ms, i, S.WAITING if serving else S.SERVING, reasons, "lastsrv back")
        elif m.state == S.OFFLINE:
            _set(ms, i, S.WAITING, reasons, "back")
    # 4. never stuck: no serving and no lastsrv member -> the first alive member serves; never
    # an empty one (a replaced disk): with no other, the chain waits for a member holding its data
    st = _states(ms)
    if S.SERVING not in st and S.LASTSRV not in st:
        for i, m in enumerate(ms):
            if m.alive and not m.blank:
                _set(ms, i, S.SERVING, reasons, "no better replica known")
                break
    # 5. syncing: finished -> serving; no source left -> waiting; one at a time
    serving = S.SERVING in _states(ms)
    for i, m in enumerate(ms):
        if m.state == S.SYNCING and m.alive:
            if not serving:
                _set(ms, i, S.WAITING, reasons, "no serving source")
            elif m.sync_done:
                _set(ms, i, S.SERVING, reasons, "resync done")
                ms[i] = replace(ms[i], blank=False)  # it holds the chain's data now
    if serving and S.SYNCING not in _states(ms):
        for i, m in enumerate(ms):
            # (a blank target whose process just restarted waits one round: a resync it was in
            # must end under a new chain version, not go on as if nothing had happened)
            if m.state == S.WAITING and m.alive and not (m.blank and m.restarted):
                _set(ms, i, S.SYNCING, reasons, "resync from predecessor")
                break


def pick_spare(spares: list[Member], used_nodes: set[int], node_load: dict[int, int],
               used_domains: set[object] | None = None) -> Member | None:
    """An alive, non-draining spare on a node the chain does not use; one in a failure domain
    the chain does not use (``used_domains``, ``Member.domain_key``) first, then the
    least-loaded node."""
    ok = [s for s in spares if s.alive and not s.draining and s.node_id not in used_nodes]
    if not ok:
        return None
    used = used_domains or set()
    return min(ok, key=lambda s: (s.domain_key in used, node_load.get(s.node_id, 0), s.target_id))


def plan_chain(
    members: list[Member],
    *,
    spares: list[Member] = (),  # type: ignore[assignment]
    replicas: int = 0,
    now_s: float = 0.0,
    replace_after_s: float = 0.0,  # 0 = never replace
    node_load: dict[int, int] | None = None,  # chain memberships per node (spread spares)
) -> ChainPlan:
    ms = list(members)
    reasons: list[str] = []
    removed: list[int] = []
    added: list[int] = []
    pool = list(spares)
    load = node_load or {}
    _step_states(ms, reasons)
    # replacement of long-offline targets by spares
    if replace_after_s > 0:
        for i, m in enumerate(ms):
            if m.state != S.OFFLINE or m.offline_since_s is None or now_s - m.offline_since_s < replace_after_s:
                continue
            if S.SERVING not in _states(ms):
                break  # nothing to rebuild from
            others = [x for x in ms if x is not m]
            spare = pick_spare(pool, {x.node_id for x in others}, load, {x.domain_key for x in others})
            if spare is None:
                break
            pool.remove(spare)
            reasons.append(f"target {m.target_id} offline {now_s - m.offline_since_s:.0f}s: replaced by spare "
                           f"{spare.target_id}")
            removed.append(m.target_id)
            added.append(spare.target_id)
            ms[i] = replace(spare, state=S.WAITING, restarted=False, sync_done=False)
    # drain: add a spare next to a draining member, drop the member once enough serve without it
    draining = [m for m in ms if m.draining]
    if draining:
        healthy = [m for m in ms if m.state == S.SERVING and not m.draining]
        want = replicas or len(ms) - len(draining)
        if len(healthy) >= want:
            for m in draining:
                reasons.append(f"target {m.target_id} drained: leaves the chain")
                removed.append(m.target_id)
            ms = [m for m in ms if not m.draining]
        elif all(m.state == S.SERVING for m in ms) and len(ms) < want + len(draining):
            staying = [x for x in ms if not x.draining]
            spare = pick_spare(pool, {x.node_id for x in ms}, load, {x.domain_key for x in staying})
            if spare is not None:
                reasons.append(f"spare {spare.target_id} joins to replace draining target {draining[0].target_id}")
                added.append(spare.target_id)
                ms.append(replace(spare, state=S.WAITING, restarted=False, sync_done=False))
    if removed or added:
        _step_states(ms, reasons)
    ms.sort(key=lambda m: _ORDER[m.state])  # stable: serving keep their order
    return ChainPlan(ms, removed, added, reasons)


@dataclass(frozen=True, slots=True)
class Suspicion:
    """A chain member's report that its successor does not answer, waiting for a verdict."""

    reporter_node: int
    reporter_target: int
    suspect_target: int
    chain_version: int
    received_s: float  # when mgmtd got the report (the settle window starts here)
    suspect_reachable: bool | None = None  # did mgmtd reach the suspect; None: still probing it


def pick_suspicion(write_path: Sequence[int], reports: Iterable[Suspicion], *, now_s: float,
                   settle_s: float) -> Suspicion | None:
    """The report of one chain to act on now (its suspect is blamed), or None: wait.

    Forwards run head -> tail and every member waits for its successor, so one hung member
    makes *every* member upstream of it time out at about the same moment, each reporting
    its own successor: with ``[H, M, T]`` and T hung, H reports M and M reports T. Only the
    most downstream report names the fault; the ones upstream of it are its echoes. So:

    * only the most downstream report (by its reporter's place on ``write_path``) can be acted
      on; reports upstream of it wait, and are dropped when the chain changes;
    * while mgmtd is still probing its suspect, wait (the probe may say it is the culprit);
    * act at once when mgmtd could not reach the suspect (it is down or cut off: it is the
      fault whatever lies behind it) or the suspect is the last member of the write path
      (nothing downstream could be the cause);
    * otherwise (mgmtd reached it, and it has a successor it may be waiting for) act only
      after ``settle_s``, which leaves the suspect time to report its own successor, which
      would move the blame downstream. A suspect that reports nothing in that time is
      itself the fault (a cut between it and the reporter).
    """
    on_path = [r for r in reports if r.reporter_target in write_path and r.suspect_target in write_path]
    if not on_path:
        return None
    last = max(on_path, key=lambda r: (write_path.index(r.reporter_target), r.received_s))
    if last.suspect_reachable is None:
        return None
    nothing_downstream = write_path.index(last.suspect_target) == len(write_path) - 1
    if not last.suspect_reachable or nothing_downstream or now_s - last.received_s >= settle_s:
        return last
    return None
