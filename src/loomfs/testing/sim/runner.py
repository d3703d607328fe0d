"""Run one seed (a whole cluster life: start, work under faults, heal, converge, check), or many.

``run_seed(seed)`` is deterministic: the same seed and code give the same event trace (its
digest is in the result). Everything random is drawn from streams derived from the seed
(network, faults, workload, each node and client, the RPC retry jitter, trace ids, and the
global ``random`` module, which routing uses), and time is the loop's virtual clock:
``time.monotonic()`` raises inside a run, so a component that reads the real clock is found.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from loomfs.common import trace as trace_ids
from loomfs.storage import planted
from loomfs.testing.sim.cluster import SimCluster
from loomfs.testing.sim.config import BLOCKS, CI, FSYNC, REPLACE, SOAK, SimConfig
from loomfs.testing.sim.events import EventLog
from loomfs.testing.sim.faults import FaultInjector
from loomfs.testing.sim.invariants import (
    VersionRecord,
    Violation,
    check_histories,
    convergence_problems,
    final_contents,
)
from loomfs.testing.sim.loop import SimError, SimLoop
from loomfs.testing.sim.workload import Workload

PROFILES: dict[str, SimConfig] = {"ci": CI, "soak": SOAK, "fsync": FSYNC, "blocks": BLOCKS, "replace": REPLACE}
CHECK_STATES_MAX = 300_000


@dataclass
class SimResult:
    seed: int
    profile: str
    violations: list[Violation]
    digest: str
    notes: list[str] = field(default_factory=list)
    stats: dict[str, float] = field(default_factory=dict)
    trace: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    cpu_s: float = 0.0
    skip: tuple[str, ...] = ()  # fault kinds turned off
    plant: tuple[str, ...] = ()  # planted bugs (storage.planted) that were on

    @property
    def ok(self) -> bool:
        return not self.violations

    def replay_command(self) -> str:
        cmd = f"python -m loomfs.testing.sim --seed {self.seed} --profile {self.profile}"
        if self.skip:
            cmd += f" --skip {','.join(self.skip)}"
        if self.plant:
            cmd += f" --plant {','.join(self.plant)}"
        return cmd + " --trace"

    def summary(self) -> str:
        if self.ok:
            return f"seed {self.seed}: ok ({self.digest})"
        lines = [f"seed {self.seed}: FAILED ({len(self.violations)} violations, trace {self.digest})"]
        lines += [f"  {v}" for v in self.violations[:5]]
        lines.append(f"  replay: {self.replay_command()}")
        return "\n".join(lines)


@contextlib.contextmanager
def _no_real_clock() -> Iterator[None]:
    """``time.monotonic()`` raises on this thread while a simulation runs."""
    real = time.monotonic
    me = threading.get_ident()

    def guarded() -> float:
        if threading.get_ident() == me:
            raise SimError("time.monotonic() under the simulator: inject the loop's clock instead")
        return real()

    time.monotonic = guarded
    try:
        yield
    finally:
        time.monotonic = real


@contextlib.contextmanager
def _quiet_logs(verbose: bool) -> Iterator[None]:
    log = logging.getLogger("loomfs")
    old = log.level
    if not verbose:
        log.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        log.setLevel(old)


async def _watch_chains(cluster: SimCluster, log: EventLog) -> None:
    seen: dict[int, str] = {}
    version = -1
    while True:
        st = cluster.last_state
        if st is not None and st.version != version:
            version = st.version
            for line in cluster.chain_summary():
                cid = int(line.split()[1])
                body = line.split(" ", 2)[2]
                if seen.get(cid) != body:
                    seen[cid] = body
                    log.add(line)
        await asyncio.sleep(0.05)


async def _life(seed: int, cfg: SimConfig, log: EventLog, record: VersionRecord) -> SimResult:
    loop = asyncio.get_running_loop()
    cluster = SimCluster(cfg, seed, log, record)
    await cluster.start()
    watcher = asyncio.ensure_future(_watch_chains(cluster, log))
    workload = Workload(cluster, cfg, log, cluster.rng("workload"), record.removed_inodes)
    injector = FaultInjector(cluster, cfg, log, cluster.rng("faults"))
    until_s = loop.time() + cfg.duration_s
    clients = [cluster.spawn(c.host, workload.run_client(c, until_s)) for c in cluster.clients]
    if cfg.removals:
        clients.append(cluster.spawn(cluster.clients[0].host, workload.run_removals(until_s)))
    if cfg.faults:
        await injector.run(until_s)
    await asyncio.gather(*clients)
    await injector.heal_all()
    violations: list[Violation] = []
    deadline_s = loop.time() + cfg.converge_s
    if cfg.removals:
        await workload.finish_removals(cfg.converge_s / 2)
        if workload.unremoved:
            violations.append(Violation("removal", f"deleted files' chunks never removed: "
                                        f"{[hex(i) for i in workload.unremoved]}"))
    problems = convergence_problems(cluster)
    while problems and loop.time() < deadline_s:
        await asyncio.sleep(0.25)
        problems = convergence_problems(cluster)
    converged_s = loop.time() - (deadline_s - cfg.converge_s)
    if problems:
        violations.append(Violation("convergence", f"not converged {cfg.converge_s:.0f}s after the faults "
                                    f"stopped: " + "; ".join(problems[:6])))
    else:
        log.add(f"converged after {converged_s:.3f}s")
    reader = cluster.clients[0]
    for index in range(cfg.chunks):
        await workload.read(reader, index, 0, cfg.chunk_size_bytes)
    finals = None if problems else {i: final_contents(cluster, i) for i in range(cfg.chunks)}
    watcher.cancel()
    found, notes = check_histories(workload.history, finals, max_states=CHECK_STATES_MAX, flips=injector.flips)
    violations = record.violations + violations + found
    violations += [Violation("client-exception", u) for u in workload.unexpected]
    violations += [Violation("harness", e) for e in cluster.errors]
    for index in range(cfg.chunks):
        if finals is not None:
            log.add(f"final k{index}: {len(finals[index])} bytes")
    stats = {
        "ops": workload.ops(), "acked": workload.acked, "failed": workload.failed,
        "faults": injector.injected, "faults_refused": injector.refused, "commits": record.commits,
        "serves": record.serves, "frames": cluster.net.frames_delivered, "virtual_s": loop.time(),
        "converge_s": converged_s, "removals": workload.removals,
        "removed_chunks_held": workload.removed_chunks_held,
    }
    return SimResult(seed, "", violations, "", notes, stats)


@contextlib.contextmanager
def _planted(names: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    """Turn on exactly ``names`` (plus any from $LOOMFS_PLANTED_BUGS) for one run."""
    saved = set(planted.PLANTED)
    planted.plant(*names)
    try:
        yield tuple(sorted(planted.PLANTED))
    finally:
        planted.clear()
        planted.PLANTED.update(saved)


def run_seed(seed: int, profile: str = "ci", *, cfg: SimConfig | None = None, skip: tuple[str, ...] = (),
             plant: tuple[str, ...] = (), echo: bool = False, keep_trace: bool = False,
             verbose: bool = False) -> SimResult:
    """Simulate one seed; never raises for a failure of the system under test. ``skip``: fault
    kinds to leave out; ``plant``: planted bugs (``storage.planted``) to turn on."""
    cfg = cfg or PROFILES[profile]
    if skip:
        cfg = cfg.with_(fault_kinds=tuple(k for k in cfg.fault_kinds if k not in skip))
    started = time.perf_counter()
    cpu_started = time.process_time()
    log = EventLog(echo=echo)
    record = VersionRecord()
    random.seed(f"{seed}/global")
    trace_ids._rng.seed(f"{seed}/trace")
    loop = SimLoop(wall_limit_s=cfg.wall_limit_s)
    result: SimResult
    with _no_real_clock(), _quiet_logs(verbose), _planted(plant) as active:
        try:
            result = loop.run_until_complete(_life(seed, cfg, log, record))
        except SimError as exc:
            log.add(f"simulation error: {type(exc).__name__}: {exc}")
            result = SimResult(seed, profile, [*record.violations, Violation("harness", f"{type(exc).__name__}: {exc}")],
                               "")
        finally:
            loop.shutdown()
    result.profile = profile
    result.skip = tuple(skip)
    result.plant = active
    result.digest = log.digest()
    result.notes += loop.errors[:10]
    if keep_trace or not result.ok:
        result.trace = list(log.lines)
    result.wall_s = time.perf_counter() - started
    result.cpu_s = time.process_time() - cpu_started
    return result


# ---- many seeds ----------------------------------------------------------------------------
def _one(args: tuple[int, str, tuple[str, ...], tuple[str, ...]]) -> SimResult:
    seed, profile, skip, plant = args
    r = run_seed(seed, profile, skip=skip, plant=plant)
    r.trace = r.trace[-60:]  # enough to diagnose from the summary; replay gives all
    return r


def run_many(seeds: range | list[int], profile: str = "ci", *, jobs: int = 1, skip: tuple[str, ...] = (),
             plant: tuple[str, ...] = (), on_result: Callable[[SimResult], None] | None = None) -> list[SimResult]:
    """Run ``seeds`` (in ``jobs`` processes); results in seed order."""
    work = [(s, profile, skip, plant) for s in seeds]
    results: list[SimResult] = []
    if jobs <= 1:
        for w in work:
            r = _one(w)
            results.append(r)
            if on_result is not None:
                on_result(r)
    else:
        # spawn, not fork: a forked worker would share whatever the parent holds, e.g. the
        # buffer pool's anonymous mmaps (MAP_SHARED), which two workers would then both write
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(jobs) as pool:
            for r in pool.imap_unordered(_one, work, chunksize=4):
                results.append(r)
                if on_result is not None:
                    on_result(r)
    results.sort(key=lambda r: r.seed)
    return results
