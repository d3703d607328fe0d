"""Faults at seeded random times, within a budget that keeps acknowledged data recoverable.

Kinds: storage process crash (optionally tearing its newest commit) and restart after a
delay; pause (a frozen process and NIC: gray failure); two-way and one-way partitions between
any two hosts; link faults on every link of one host (delay spikes, reordering, duplicated
requests, connection resets); disk faults (EIO or ENOSPC on stage); a bit flip in committed
data; mgmtd crash and restart; a failed fsync (the target leaves service until its process
restarts; profiles "fsync", "blocks" and "replace"); a replaced disk (the process restarts with
one target empty; profile "replace" only).

Budget: a fault may only hit storage nodes if afterwards every chain still has a member that
mgmtd lists as serving on a node no fault touches (nor touched within ``grace_s``, nor holding
an unrepaired corrupt chunk). Beyond that (R failures at once) acknowledged data can be lost
legitimately and the invariants would prove nothing. Faults that touch no storage node (mgmtd,
client links) are free.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from loomfs.net.sim import LinkState
from loomfs.testing.sim.cluster import MGMTD_HOST, SimCluster
from loomfs.testing.sim.config import FAULT_KINDS, FAULT_WEIGHTS, SimConfig
from loomfs.testing.sim.engine import FaultyEngine
from loomfs.testing.sim.events import EventLog
from loomfs.testing.sim.invariants import Flip
from loomfs.wire.types import TargetState

AT_IO_WAIT_S = 1.0


@dataclass
class Fault:
    name: str
    nodes: frozenset[int]  # storage nodes it touches
    slots: frozenset[str]  # what it holds ("proc:s1", "links:s1", "cut:c1|s2", "disk:s1"): one fault each
    undo: Callable[[], Awaitable[None]]
    task: asyncio.Task[None] | None = None
    done: bool = False


class FaultInjector:
    def __init__(self, cluster: SimCluster, cfg: SimConfig, log: EventLog, rng: random.Random):
        self.cluster = cluster
        self.cfg = cfg
        self.log = log
        self.rng = rng
        self.active: list[Fault] = []
        self.released_s: dict[int, float] = {}  # storage node -> when its last fault ended
        self.grace_s = 2 * cfg.lease_s
        self.injected = 0
        self.refused = 0
        self.flips: list[Flip] = []  # bytes flipped or torn, for failure hints

    # ---- budget -------------------------------------------------------------------------
    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def impaired(self, node_id: int) -> bool:
        sh = self.cluster.storage[node_id]
        if not sh.up or any(node_id in f.nodes for f in self.active):
            return True
        if self._now() - self.released_s.get(node_id, -1e9) < self.grace_s:
            return True
        return any(e.bad_chunks() for e in sh.engines)

    def allowed(self, victims: set[int]) -> bool:
        if not victims:
            return True
        st = self.cluster.state
        for c in st.chains.values():
            healthy = [t for t in c.targets if st.targets[t].state == TargetState.SERVING
                       and (n := self.cluster.node_of_target(t)) not in victims and not self.impaired(n)]
            if not healthy:
                return False
        return True

    def _busy(self, *slots: str) -> bool:
        """Is any of ``slots`` held by an active fault? (A host may be cut off and crash, but
        not be paused and crashed, or carry two link faults, at once.)"""
        return any(s in f.slots for f in self.active for s in slots)

    # ---- the loop -----------------------------------------------------------------------
    async def run(self, until_s: float) -> None:
        rng = self.rng
        enabled = set(self.cfg.fault_kinds)
        weights = [w if k in enabled else 0 for k, w in zip(FAULT_KINDS, FAULT_WEIGHTS, strict=True)]
        if not any(weights):
            return
        while True:
            await asyncio.sleep(rng.expovariate(1.0 / self.cfg.fault_gap_s_mean))
            if self._now() >= until_s:
                return
            kind = rng.choices(FAULT_KINDS, weights)[0]
            await getattr(self, f"_{kind}")()

    def _start(self, fault: Fault, duration_s: float) -> None:
        self.injected += 1
        self.active.append(fault)

        async def hold() -> None:
            await asyncio.sleep(duration_s)
            await self._end(fault)

        # the driver's task, even when started from inside a host's call (an at-commit fault):
        # a fault must not die or freeze with the host it hits
        fault.task = self.cluster.loop.create_task(hold(), context=self.cluster.net.context_of("").copy())

    async def _end(self, fault: Fault) -> None:
        if fault.done:
            return
        fault.done = True
        self.active.remove(fault)
        await fault.undo()
        for n in fault.nodes:
            self.released_s[n] = self._now()
        self.log.add(f"fault end: {fault.name}")

    async def heal_all(self) -> None:
        """Stop every fault now (the quiet phase); undo them in the order they started."""
        for fault in list(self.active):
            if fault.task is not None:
                fault.task.cancel()
            await self._end(fault)
        self.cluster.net.heal_all()
        if self.cluster.mgmtd is None:
            await self.cluster.start_mgmtd()
        for sh in self.cluster.storage.values():
            for e in sh.engines:
                e.eio_rate, e.enospc = 0.0, False
            if not sh.up:
                self.cluster.start_storage(sh.node_id)
        self.log.add("quiet: every fault healed")

    def _duration(self) -> float:
        return self.rng.uniform(0.1, self.cfg.fault_len_s_max)

    def _refuse(self, what: str) -> None:
        self.refused += 1

    def _storage_node(self) -> int:
        return self.rng.choice(sorted(self.cluster.storage))

    # ---- kinds --------------------------------------------------------------------------
    async def _at_io(self, n: int, act: Callable[[int], bool], wanted: str = "") -> str:
        """Wait (up to ``AT_IO_WAIT_S``) for node ``n`` to commit (or read) something and run
        ``act(target_id)`` right after, inside that call: the moment a process dies, freezes or
        loses a link is then one where it matters (the commit is on disk and its ack not sent;
        a chunk read for a resync copy or a client and not yet sent). Returns what it followed
        ("commit" or "read"), or "" when nothing came in time, the budget no longer allows it
        or ``act`` declined."""
        engines = self.cluster.storage[n].engines
        wanted = wanted or self.rng.choice(("commit", "commit", "read"))
        fired: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        def arm(engine: FaultyEngine) -> None:
            def hook(op: str, key: object) -> None:
                if op != wanted:
                    engine.after_io = hook  # not the moment we wait for: stay armed
                    return
                for e in engines:
                    e.after_io = None
                if fired.done():
                    return
                ok = self.cluster.storage[n].up and self.allowed({n}) and act(engine.target_id)
                fired.set_result(op if ok else "")

            engine.after_io = hook

        for e in engines:
            arm(e)
        try:
            return await asyncio.wait_for(asyncio.shield(fired), AT_IO_WAIT_S)
        except TimeoutError:
            for e in engines:
                e.after_io = None
            return ""

    def _resync_source(self) -> int | None:
        """A storage node that is copying to a syncing target right now, if any."""
        st = self.cluster.state
        for cid in sorted(st.chains):
            members = st.chains[cid].targets
            states = [st.targets[t].state for t in members]
            if TargetState.SYNCING in states:
                serving = [t for t, s in zip(members, states, strict=True) if s == TargetState.SERVING]
                if serving:
                    return self.cluster.node_of_target(serving[-1])
        return None

    def _victim(self) -> int:
        """A storage node: often the one running a resync (the window where stale copies and
        rollbacks happen), else any."""
        source = self._resync_source()
        if source is not None and self.rng.random() < 0.5:
            return source
        return self._storage_node()

    async def _crash(self) -> None:
        c = self.cluster
        n = self._victim()
        host = c.storage[n].host
        if not c.storage[n].up or self._busy(f"proc:{host}") or not self.allowed({n}):
            return self._refuse("crash")
        tear = self.rng.random() < 0.3
        delay_s = self.rng.uniform(0.05, self.cfg.restart_delay_s_max)
        at_io = ""
        killed: list[asyncio.Task[Any]] | None = None
        if self.rng.random() < 0.5:

            def kill(target_id: int) -> bool:
                nonlocal killed
                killed = c.kill_storage_now(n)
                return True

            at_io = await self._at_io(n, kill)
            if not at_io:
                return self._refuse("crash")

        async def undo() -> None:
            if not c.storage[n].up:
                c.start_storage(n)

        fault = Fault(f"crash s{n}", frozenset({n}), frozenset({f"proc:{host}"}), undo)
        self._start(fault, delay_s)
        torn = await c.crash_storage(n, tear=tear, killed=killed)
        when = f" right after a {at_io}" if at_io else ""
        self.log.add(f"fault: crash s{n}{when} for {delay_s:.3f}s" + (f" torn {' '.join(torn)}" if torn else ""))

    async def _wipe(self) -> None:
        """A replaced disk: the node's process stops, one of its targets loses every chunk
        (a new, empty disk under the same target id) and the process starts again after a
        delay. The target must come back through a full resync, never serve or head anything
        from its empty disk meanwhile."""
        c = self.cluster
        n = self._victim()
        sh = c.storage[n]
        if not sh.up or self._busy(f"proc:{sh.host}", f"disk:{sh.host}") or not self.allowed({n}):
            return self._refuse("wipe")
        engine = sh.engines[self.rng.randrange(len(sh.engines))]
        delay_s = self.rng.uniform(0.05, self.cfg.restart_delay_s_max)

        async def undo() -> None:
            if not c.storage[n].up:
                c.start_storage(n)

        fault = Fault(f"wipe s{n} t{engine.target_id}", frozenset({n}),
                      frozenset({f"proc:{sh.host}", f"disk:{sh.host}"}), undo)
        self._start(fault, delay_s)
        await c.crash_storage(n)
        held = engine.wipe(c.new_format_id(engine.target_id))
        self.log.add(f"fault: wipe s{n} t{engine.target_id} ({held} chunks) for {delay_s:.3f}s")

    async def _pause(self) -> None:
        c = self.cluster
        host = MGMTD_HOST if self.rng.random() < 0.2 else c.storage[self._victim()].host
        nodes = frozenset(n for n, sh in c.storage.items() if sh.host == host)
        if self._busy(f"proc:{host}") or (host == MGMTD_HOST and c.mgmtd is None) or not self.allowed(set(nodes)):
            return self._refuse("pause")
        if nodes and not c.storage[next(iter(nodes))].up:
            return self._refuse("pause")
        duration_s = self._duration()

        def freeze(target_id: int = 0) -> bool:
            c.net.pause(host)
            c.loop.pause_host(host)
            return True

        async def undo() -> None:
            c.net.resume(host)
            c.loop.resume_host(host)

        at_io = ""
        if nodes and self.rng.random() < 0.5:
            at_io = await self._at_io(next(iter(nodes)), freeze)
            if not at_io:
                return self._refuse("pause")
        else:
            freeze()
        self._start(Fault(f"pause {host}", nodes, frozenset({f"proc:{host}"}), undo), duration_s)
        when = f" right after a {at_io}" if at_io else ""
        self.log.add(f"fault: pause {host}{when} for {duration_s:.3f}s")

    def _hosts(self) -> list[str]:
        c = self.cluster
        return [MGMTD_HOST] + [c.storage[n].host for n in sorted(c.storage)] + [cl.host for cl in c.clients]

    def _nodes_of(self, *hosts: str) -> frozenset[int]:
        return frozenset(n for n, sh in self.cluster.storage.items() if sh.host in hosts)

    def _pair(self) -> tuple[str, str]:
        """Two hosts to cut apart: mostly storage-mgmtd and storage-storage (where chains and
        leases live), sometimes a client and a server."""
        c = self.cluster
        storage = [c.storage[n].host for n in sorted(c.storage)]
        r = self.rng.random()
        if r < 0.4:
            pair = [self.rng.choice(storage), MGMTD_HOST]
        elif r < 0.8:
            pair = self.rng.sample(storage, 2)
        else:
            pair = [self.rng.choice([cl.host for cl in c.clients]), self.rng.choice([*storage, MGMTD_HOST])]
        self.rng.shuffle(pair)
        return pair[0], pair[1]

    def _cut(self, a: str, b: str, one_way: bool, at: str = "") -> bool:
        c = self.cluster
        nodes = self._nodes_of(a, b)
        pair = f"cut:{min(a, b)}|{max(a, b)}"
        if self._busy(pair) or not self.allowed(set(nodes)):
            return False
        duration_s = self._duration()

        async def undo() -> None:
            c.net.heal(a, b)

        if one_way:
            c.net.cut(a, b)
        else:
            c.net.partition(a, b)
        name = f"cut {a}->{b}" if one_way else f"partition {a}<->{b}"
        self._start(Fault(name, nodes, frozenset({pair}), undo), duration_s)
        self.log.add(f"fault: {name}{at} for {duration_s:.3f}s")
        return True

    def _predecessor_host(self, target_id: int) -> str | None:
        """The host of ``target_id``'s predecessor in its write chain (per mgmtd)."""
        st = self.cluster.state
        t = st.targets.get(target_id)
        chain = st.chains.get(t.chain_id) if t is not None else None
        if chain is None:
            return None
        members = [m for m in chain.targets if st.targets[m].state in (TargetState.SERVING, TargetState.SYNCING)]
        if target_id not in members or members.index(target_id) == 0:
            return None
        return self.cluster.storage[self.cluster.node_of_target(members[members.index(target_id) - 1])].host

    async def _partition(self) -> None:
        if self.rng.random() < 0.25:
            # a replica loses the link back to its predecessor right after committing: it keeps
            # serving what it committed while the chain behind it never hears of it
            n = self._victim()
            host = self.cluster.storage[n].host
            if not self.cluster.storage[n].up:
                return self._refuse("partition")

            def cut_back(target_id: int) -> bool:
                pred = self._predecessor_host(target_id)
                return pred is not None and self._cut(host, pred, True, " right after a commit")

            if not await self._at_io(n, cut_back, "commit"):
                self._refuse("partition")
            return
        a, b = self._pair()
        if not self._cut(a, b, self.rng.random() < 0.5):
            self._refuse("partition")

    async def _link(self) -> None:
        c = self.cluster
        host = self.rng.choice(self._hosts())
        nodes = self._nodes_of(host)
        others = [h for h in self._hosts() if h != host]
        if self._busy(f"links:{host}", *(f"links:{o}" for o in others)) or not self.allowed(set(nodes)):
            return self._refuse("link")
        rng = self.rng
        what = rng.choice(("delay", "reorder", "dup", "reset"))
        if what == "delay":
            state = LinkState(extra_delay_s=rng.uniform(0.02, 1.5))
        elif what == "reorder":
            state = LinkState(reorder_s=rng.uniform(0.005, 0.2))
        elif what == "dup":
            state = LinkState(dup_rate=rng.uniform(0.1, 0.6), dup_delay_s=rng.uniform(0.001, 0.5))
        else:
            state = LinkState(reset_rate=rng.uniform(0.02, 0.25))
        for o in others:
            c.net.set_link(host, o, state)
            c.net.set_link(o, host, state)
        duration_s = self._duration()

        async def undo() -> None:
            for o in others:
                c.net.set_link(host, o, LinkState())
                c.net.set_link(o, host, LinkState())

        name = f"link {what} {host} {_fmt(state)}"
        self._start(Fault(name, nodes, frozenset({f"links:{host}"}), undo), duration_s)
        self.log.add(f"fault: {name} for {duration_s:.3f}s")

    async def _disk(self) -> None:
        c = self.cluster
        n = self._storage_node()
        sh = c.storage[n]
        if not sh.up or self._busy(f"disk:{sh.host}") or not self.allowed({n}):
            return self._refuse("disk")
        enospc = self.rng.random() < 0.4
        eio_rate = 0.0 if enospc else self.rng.uniform(0.05, 0.5)
        for e in sh.engines:
            e.enospc, e.eio_rate = enospc, eio_rate
        duration_s = self.rng.uniform(0.05, self.cfg.disk_fault_s_max)

        async def undo() -> None:
            for e in sh.engines:
                e.enospc, e.eio_rate = False, 0.0

        name = f"disk s{n} " + ("enospc" if enospc else f"eio={eio_rate:.2f}")
        self._start(Fault(name, frozenset({n}), frozenset({f"disk:{sh.host}"}), undo), duration_s)
        self.log.add(f"fault: {name} for {duration_s:.3f}s")

    async def _fsync(self) -> None:
        """A failed fsync (storage.engine.diskfail): the next commit on one target of a node
        fails with EIO and takes the target out of service; the node keeps running and reports
        it OFFLINE until an operator restarts it (the fault's end: crash and restart), which
        brings the target back verified and resynced."""
        c = self.cluster
        n = self._victim()
        sh = c.storage[n]
        if not sh.up or self._busy(f"proc:{sh.host}", f"disk:{sh.host}") or not self.allowed({n}):
            return self._refuse("fsync")
        engine = sh.engines[self.rng.randrange(len(sh.engines))]
        engine.fail_fsyncs, engine.fsync_every_commit = 1, True
        duration_s = self.rng.uniform(0.5, self.cfg.fault_len_s_max)
        loss = c.rng(f"fsync-loss/{engine.target_id}/{self._now():.6f}")  # its own stream

        async def undo() -> None:
            engine.fail_fsyncs, engine.fsync_every_commit = 0, False
            if engine.failed and c.storage[n].up:
                # the failing disk lost a committed chunk's pages, and may refuse the FSYNC_FAILED
                # marker too (reviewer's R5: then only mgmtd remembers the target must be verified)
                lost = engine.lose_pages(loss)
                engine.marker_refused = loss.random() < 0.5
                self.log.add(f"fsync s{n}: target {engine.target_id} failed: restarting the process"
                             + (f" (pages of {lost} lost)" if lost is not None else "")
                             + (" (its marker refused)" if engine.marker_refused else ""))
                await c.crash_storage(n)
                c.start_storage(n)

        name = f"fsync s{n} t{engine.target_id}"
        self._start(Fault(name, frozenset({n}), frozenset({f"proc:{sh.host}", f"disk:{sh.host}"}), undo), duration_s)
        self.log.add(f"fault: {name} fails its next commit's fsync; restart after {duration_s:.3f}s")

    async def _flip(self) -> None:
        c = self.cluster
        n = self._storage_node()
        sh = c.storage[n]
        if not sh.up or not self.allowed({n}):
            return self._refuse("flip")
        engine = sh.engines[self.rng.randrange(len(sh.engines))]
        hit = engine.flip()
        if hit is None:
            return
        self.injected += 1
        self.released_s[n] = self._now()
        self.flips.append(Flip(self._now(), engine.target_id, hit[0].index, hit[1]))
        self.log.add(f"fault: flip t{engine.target_id} chunk {hit[0]} offset {hit[1]}")

    async def _mgmtd(self) -> None:
        c = self.cluster
        if c.mgmtd is None or self._busy(f"proc:{MGMTD_HOST}"):
            return self._refuse("mgmtd")
        delay_s = self.rng.uniform(0.05, self.cfg.restart_delay_s_max)

        async def undo() -> None:
            if c.mgmtd is None:
                await c.start_mgmtd()

        self._start(Fault("mgmtd restart", frozenset(), frozenset({f"proc:{MGMTD_HOST}"}), undo), delay_s)
        await c.crash_mgmtd()
        self.log.add(f"fault: mgmtd crash for {delay_s:.3f}s")

    def __repr__(self) -> str:
        return f"FaultInjector(active={len(self.active)} injected={self.injected} refused={self.refused})"


def _fmt(state: LinkState) -> str:
    parts = [f"{k}={v:.3f}" for k, v in (("delay", state.extra_delay_s), ("reorder", state.reorder_s),
                                         ("dup", state.dup_rate), ("reset", state.reset_rate)) if v]
    return " ".join(parts)
