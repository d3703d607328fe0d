"""What must hold, during and after a run.

During the run (``VersionRecord``, told by every engine):
* a version names one content: every commit of (chunk, version) on any target, whether by a
  write, a resync copy or a scrub repair, has the same length and CRC32C, and every read a
  replica serves is of such a version.

After the faults stop (``convergence_problems``, polled until empty or the bound passes):
* mgmtd is up and every storage node has its current routing;
* every chain has exactly R members, all serving (none syncing, waiting, offline, lastsrv);
* the members of a chain hold the same chunks with the same version, length, CRC and bytes
  (content compared, not only versions), the bytes match their CRCs, nothing is pending.

Then (``check_histories``): each chunk's client history is linearizable (reads consistent
with one order of the writes and truncates that respects real time), and some such order ends
in the bytes the replicas hold, so no acknowledged write was lost.
"""

from __future__ import annotations

import asyncio
import copy
import re
from dataclasses import dataclass

from loomfs.storage.engine.types import ChunkKey, ChunkState
from loomfs.testing.sim.cluster import INODE, SimCluster
from loomfs.testing.sim.history import Op, check_chunk_history, check_final_state
from loomfs.wire.types import TargetState


@dataclass(frozen=True, slots=True)
class Violation:
    invariant: str  # short name: "version-content", "convergence", "linearizable", ...
    detail: str

    def __str__(self) -> str:
        return f"[{self.invariant}] {self.detail}"


class VersionRecord:
    """(chunk, version) -> (length, crc) as first committed anywhere; checks every commit and
    every served read against it."""

    def __init__(self) -> None:
        self.committed: dict[tuple[ChunkKey, int], tuple[int, int, int, float]] = {}
        self.violations: list[Violation] = []
        self.commits = 0
        self.serves = 0
        # deleted files whose removal started: a chunk re-created there by a late writer starts
        # its numbers again at 1 (only a deleted file's chunks are removed, by design), so its
        # versions are left unchecked; the replicas must still agree (convergence)
        self.removed_inodes: set[int] = set()

    @staticmethod
    def _now() -> float:
        try:
            return asyncio.get_running_loop().time()
        except RuntimeError:
            return 0.0

    def on_commit(self, target_id: int, st: ChunkState) -> None:
        self.commits += 1
        if st.key.inode in self.removed_inodes:
            return
        k = (st.key, st.commit_ver)
        first = self.committed.get(k)
        if first is None:
            self.committed[k] = (st.length, st.crc, target_id, self._now())
        elif first[:2] != (st.length, st.crc):
            self._violation("version-content", f"chunk {st.key} v{st.commit_ver} committed on target {target_id} "
                            f"as {st.length} bytes crc {st.crc:08x}, but on target {first[2]} at "
                            f"t={first[3]:.6f} as {first[0]} bytes crc {first[1]:08x}")

    def on_serve(self, target_id: int, st: ChunkState) -> None:
        self.serves += 1
        if st.key.inode in self.removed_inodes:
            return
        first = self.committed.get((st.key, st.commit_ver))
        if first is None:
            self._violation("served-uncommitted", f"target {target_id} served chunk {st.key} v{st.commit_ver}, "
                            "a version no target ever committed")
        elif first[:2] != (st.length, st.crc):
            self._violation("served-other-content", f"target {target_id} served chunk {st.key} v{st.commit_ver} "
                            f"as {st.length} bytes crc {st.crc:08x}; it was committed as {first[0]} bytes "
                            f"crc {first[1]:08x} on target {first[2]}")

    def _violation(self, name: str, detail: str) -> None:
        if len(self.violations) < 20:
            self.violations.append(Violation(name, f"t={self._now():.6f} {detail}"))


def _committed_bytes(cluster: SimCluster, target_id: int, key: ChunkKey) -> bytes:
    engine = cluster.engines[target_id]
    st = engine.get(key)
    if st is None or not st.commit_ver:
        return b""
    buf = bytearray(st.length)
    engine.read(key, 0, memoryview(buf))
    return bytes(buf)


def convergence_problems(cluster: SimCluster) -> list[str]:
    """Why the cluster has not converged yet (empty: it has)."""
    if cluster.mgmtd is None:
        return ["mgmtd is down"]
    st = cluster.state
    problems: list[str] = []
    for sh in cluster.storage.values():
        node = sh.node
        if not sh.up or node is None:
            problems.append(f"{sh.host} is down")
        elif not node.routing.has_routing or node.routing.current.version < st.version:
            problems.append(f"{sh.host} has not seen routing v{st.version}")
        elif node.resyncer.active:
            problems.append(f"{sh.host} is still resyncing")
    for cid in sorted(st.chains):
        c = st.chains[cid]
        states = [TargetState(st.targets[t].state) for t in c.targets]
        if len(c.targets) != cluster.cfg.replicas or any(s != TargetState.SERVING for s in states):
            members = " ".join(f"{t}:{s.name.lower()}" for t, s in zip(c.targets, states, strict=True))
            problems.append(f"chain {cid} v{c.version} is [{members}], not {cluster.cfg.replicas} serving")
            continue
        problems += _replica_problems(cluster, cid, c.targets)
    return problems


def _replica_problems(cluster: SimCluster, chain_id: int, targets: list[int]) -> list[str]:
    engines = cluster.engines
    keys: set[ChunkKey] = set()
    for t in targets:
        keys.update(s.key for s in engines[t].list_chunks(0, limit=1 << 20))
    problems = []
    for key in sorted(keys):
        states = {t: engines[t].get(key) for t in targets}
        summary = {t: (s.commit_ver, s.length, s.crc, s.pending_ver if s.has_pending else 0) if s else None
                   for t, s in states.items()}
        if len(set(summary.values())) > 1:
            problems.append(f"chain {chain_id} chunk {key}: replicas differ: " + ", ".join(
                f"t{t}=" + (f"v{v[0]} len {v[1]} crc {v[2]:08x}" + (f" pending v{v[3]}" if v[3] else "")
                            if v else "missing") for t, v in summary.items()))
            continue
        first = next(iter(summary.values()))
        if first is not None and first[3]:
            problems.append(f"chain {chain_id} chunk {key}: pending v{first[3]} left on every replica")
        contents = {t: _committed_bytes(cluster, t, key) for t in targets}
        if len(set(contents.values())) > 1:
            problems.append(f"chain {chain_id} chunk {key}: same version v{first[0] if first else 0}, "
                            "different bytes on " + ", ".join(f"t{t}" for t in targets))
        for t in targets:
            if states[t] is not None and states[t].commit_ver and engines[t].verify(key):  # type: ignore[union-attr]
                problems.append(f"chain {chain_id} chunk {key}: target {t} holds bytes that fail their CRC")
    return problems


def final_contents(cluster: SimCluster, chunk_index: int) -> bytes:
    """The converged bytes of one workload chunk (from its chain's tail)."""
    chain_id = cluster.layout.chains[chunk_index % len(cluster.layout.chains)]
    tail = cluster.state.chains[chain_id].targets[-1]
    return _committed_bytes(cluster, tail, ChunkKey(INODE, chunk_index))


@dataclass(frozen=True, slots=True)
class Flip:
    """A byte the simulator flipped (bit rot) or tore, for hints."""

    at_s: float
    target_id: int
    chunk_index: int
    offset: int


DUPLICATE_CANDIDATES_MAX = 120


def explain(index: int, ops: list[Op], explanation: str, flips: list[Flip]) -> list[str]:
    """Likely causes of a non-linearizable history, found by trying them: an update that took
    effect twice (a retry applied again), or a read that returned a byte the simulator flipped."""
    hints = []
    updates = sorted((o for o in ops if o.kind != "read"), key=lambda o: -o.invoke_s)
    twice = []
    for o in updates[:DUPLICATE_CANDIDATES_MAX]:
        dup = copy.copy(o)
        dup.op_id, dup.ok, dup.complete_s = -o.op_id, None, None
        if check_chunk_history([*ops, dup], max_states=20_000).ok:
            twice.append(o)
    for o in twice[:3]:
        hints.append(f"explained if op {o.op_id} (client {o.client} {o.kind}, invoked t={o.invoke_s:.6f}, "
                     f"ok={o.ok}) took effect twice: a retry applied again")
    m = re.search(r"chunk offset (\d+)", explanation)
    if m:
        at = int(m.group(1))
        for f in flips:
            if f.chunk_index == index and f.offset == at:
                hints.append(f"the read differs at offset {at}, the byte flipped on target {f.target_id} at "
                             f"t={f.at_s:.6f}: bit rot served as data")
    return hints


def check_histories(history: dict[int, list[Op]], finals: dict[int, bytes] | None,
                    *, max_states: int, flips: list[Flip] | None = None) -> tuple[list[Violation], list[str]]:
    """(violations, notes): per chunk, linearizability and (with ``finals``) the final state."""
    violations: list[Violation] = []
    notes: list[str] = []
    for index in sorted(history):
        ops = history[index]
        v = check_chunk_history(ops, max_states=max_states)
        if not v.ok:
            if "search limit" in v.explanation:
                notes.append(f"chunk {index}: linearizability unknown ({v.explanation})")
            else:
                hints = explain(index, ops, v.explanation, flips or [])
                text = "".join(f"\n  hint: {h}" for h in hints)
                violations.append(Violation("linearizable", f"chunk {index}: {v.explanation}{text}"))
            continue
        if finals is None:
            continue
        v = check_final_state(ops, finals[index], max_states=max_states)
        if not v.ok:
            if "search limit" in v.explanation:
                notes.append(f"chunk {index}: final state unknown ({v.explanation})")
            else:
                violations.append(Violation("acked-write-lost", f"chunk {index}: {v.explanation}"))
    return violations, notes
