"""The simulator's own machinery: virtual time, frozen and killed hosts, guards, disk faults,
determinism of a seed's trace, and invariants that really catch what they claim to."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time

import pytest

from loomfs.net.sim import SimNetwork
from loomfs.storage.engine.types import ChunkKey, ChunkState
from loomfs.testing.sim.cluster import INODE, SimCluster, poll_until
from loomfs.testing.sim.config import CI
from loomfs.testing.sim.engine import FaultyEngine
from loomfs.testing.sim.events import EventLog
from loomfs.testing.sim.history import Op
from loomfs.testing.sim.invariants import VersionRecord, check_histories, convergence_problems
from loomfs.testing.sim.loop import SimError, SimLoop, SimStalled, run
from loomfs.testing.sim.runner import SimResult, Violation, _no_real_clock, run_seed
from loomfs.testing.sim.workload import Workload, pattern

pytestmark = pytest.mark.timeout(120)
KEY = ChunkKey(INODE, 0)


# ---- the loop -------------------------------------------------------------------------------
def test_virtual_time_is_free_and_exact() -> None:
    async def go() -> float:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(3600)
        return loop.time()

    wall = time.perf_counter()
    assert run(go()) == 3600
    assert time.perf_counter() - wall < 1


def test_a_deadlock_is_reported_not_hung() -> None:
    async def go() -> None:
        await asyncio.get_running_loop().create_future()

    with pytest.raises(SimStalled):
        run(go())


def test_threads_and_real_clock_are_refused() -> None:
    async def executor() -> None:
        await asyncio.get_running_loop().run_in_executor(None, print)

    with pytest.raises(SimError):
        run(executor())

    async def clock() -> float:
        return time.monotonic()

    with _no_real_clock(), pytest.raises(SimError):
        run(clock())
    assert time.monotonic() > 0  # restored


def test_paused_host_takes_no_step_and_killed_host_dies() -> None:
    async def go() -> list[tuple[str, float]]:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, SimLoop)
        net = SimNetwork()
        seen: list[tuple[str, float]] = []

        async def tick(name: str) -> None:
            while True:
                await asyncio.sleep(1)
                seen.append((name, loop.time()))

        async def deadline(name: str) -> None:
            try:
                async with asyncio.timeout(2.5):
                    await asyncio.sleep(10)
            except TimeoutError:
                seen.append((name, loop.time()))

        loop.create_task(tick("a"), context=net.context_of("A").copy())
        loop.create_task(tick("b"), context=net.context_of("B").copy())
        loop.create_task(deadline("b-deadline"), context=net.context_of("B").copy())
        await asyncio.sleep(1.5)
        loop.pause_host("B")
        await asyncio.sleep(3)  # B's timer and its deadline fire while it is frozen
        loop.resume_host("B")
        await asyncio.sleep(0.2)
        killed = loop.kill_host("A")
        await asyncio.sleep(2)
        assert killed and all(t.cancelled() for t in killed)
        return seen

    seen = run(go())
    b = [t for n, t in seen if n == "b"]
    assert b[:2] == [1.0, 4.5]  # nothing between 1.5 and 4.5, then the late step at resume
    assert ("b-deadline", 4.5) in seen
    assert max(t for n, t in seen if n == "a") == 4.0  # nothing after the kill at 4.7


# ---- disk faults -------------------------------------------------------------------------------
def test_faulty_engine_faults() -> None:
    async def go() -> None:
        e = FaultyEngine(1001, random.Random(1))
        e.stage_write(KEY, 1, 0, b"hello world")
        await e.commit(KEY, 1)
        e.enospc = True
        with pytest.raises(OSError) as ei:
            e.stage_write(KEY, 2, 0, b"x")
        assert ei.value.errno == 28 and not e.get(KEY).has_pending  # type: ignore[union-attr]
        e.enospc, e.eio_rate = False, 1.0
        with pytest.raises(OSError):
            e.stage_truncate(KEY, 2, 3)
        e.eio_rate = 0.0
        hit = e.flip()
        assert hit is not None and e.bad_chunks() == [KEY]
        e.stage_write(KEY, 2, 0, b"fresh bytes", full_replace=True)
        await e.commit(KEY, 2)
        assert e.bad_chunks() == []
        e.stage_write(KEY, 3, 11, b"!")
        e.crash(tear=True)  # the pending v3 is lost; the newest commit (v2) is torn
        st = e.get(KEY)
        assert st is not None and (st.commit_ver, st.has_pending) == (2, False)
        assert e.last_torn == KEY and e.bad_chunks() == [KEY]
        e.down = True
        with pytest.raises(OSError):
            e.get(KEY)

    run(go())


# ---- determinism ---------------------------------------------------------------------------------
def test_same_seed_same_trace() -> None:
    a = run_seed(7, keep_trace=True)
    b = run_seed(7, keep_trace=True)
    assert a.trace == b.trace and a.digest == b.digest
    assert len(a.trace) > 100 and any("fault:" in line for line in a.trace)
    assert run_seed(8).digest != a.digest


def test_trace_does_not_depend_on_the_hash_seed() -> None:
    code = "from loomfs.testing.sim.runner import run_seed; print(run_seed(11).digest)"
    digests = set()
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        digests.add(out.stdout.strip())
    assert len(digests) == 1, digests


def test_failure_prints_one_replay_command() -> None:
    r = SimResult(42, "ci", [Violation("linearizable", "chunk 0: ...")], "abc")
    text = r.summary()
    assert "python -m loomfs.testing.sim --seed 42 --profile ci" in text and not r.ok


# ---- invariants catch what they claim ------------------------------------------------------------
def test_version_record_catches_a_version_with_two_contents() -> None:
    rec = VersionRecord()
    rec.on_commit(1001, ChunkState(KEY, commit_ver=3, length=5, crc=0x1234))
    rec.on_commit(2001, ChunkState(KEY, commit_ver=3, length=5, crc=0x1234))
    assert rec.violations == []
    rec.on_commit(3001, ChunkState(KEY, commit_ver=3, length=5, crc=0x9999))
    rec.on_serve(1001, ChunkState(KEY, commit_ver=4, length=5, crc=0x1234))
    assert [v.invariant for v in rec.violations] == ["version-content", "served-uncommitted"]


def test_history_check_catches_a_lost_acknowledged_write() -> None:
    w = Op(1, 1, "write", 0.0, 1.0, True, offset=0, data=pattern(1, 8))
    r = Op(2, 2, "read", 2.0, 2.5, True, offset=0, length=8, result=pattern(1, 8))
    found, _ = check_histories({0: [w, r]}, {0: pattern(1, 8)}, max_states=10_000)
    assert found == []
    found, _ = check_histories({0: [w, r]}, {0: b""}, max_states=10_000)
    assert [v.invariant for v in found] == ["acked-write-lost"]
    stale = Op(3, 2, "read", 3.0, 3.5, True, offset=0, length=8, result=b"")
    found, _ = check_histories({0: [w, r, stale]}, None, max_states=10_000)
    assert [v.invariant for v in found] == ["linearizable"]


def test_convergence_check_compares_bytes_not_only_versions() -> None:
    async def go() -> list[list[str]]:
        cfg = CI.with_(clients=1)
        record = VersionRecord()
        cluster = SimCluster(cfg, 5, EventLog(), record)
        await cluster.start()
        workload = Workload(cluster, cfg, EventLog(), random.Random(1))
        client = cluster.clients[0]
        for i in range(4):
            await workload.write(client, 0, 100 * i, 300)
        await poll_until(lambda: not convergence_problems(cluster), step_s=0.1, timeout_s=10, what="converge")
        chain = cluster.state.chains[cluster.layout.chains[0]]
        engines = [cluster.engines[t] for t in chain.targets]
        out = [convergence_problems(cluster)]
        engines[1].corrupt(KEY, 7)  # same version, same recorded CRC, other bytes
        out.append(convergence_problems(cluster))
        engines[1].corrupt(KEY, 7)
        st = engines[2].get(KEY)
        assert st is not None
        engines[2].stage_write(KEY, st.commit_ver + 1, 0, b"diverged")  # a version the others lack
        await engines[2].commit(KEY, st.commit_ver + 1)
        out.append(convergence_problems(cluster))
        assert record.violations == []
        return out

    clean, corrupt, diverged = run(go())
    assert clean == []
    assert any("different bytes" in p for p in corrupt) and any("fail their CRC" in p for p in corrupt)
    assert any("replicas differ" in p for p in diverged)


def test_loop_clock_is_virtual_under_the_simulator() -> None:
    from loomfs.common.clock import LOOP_CLOCK

    async def go() -> tuple[float, int]:
        await asyncio.sleep(42)
        return LOOP_CLOCK.monotonic(), LOOP_CLOCK.now_ns()

    mono, ns = run(go())
    assert mono == 42 and ns == LOOP_CLOCK.wall_origin_ns + 42 * 10**9
    assert LOOP_CLOCK.monotonic() > 0  # outside a loop: the system clock


def test_parallel_runs_match_serial_runs() -> None:
    """Workers must not inherit state from a parent that already simulated (seeds are
    independent of where and after what they run)."""
    from loomfs.testing.sim.runner import run_many

    serial = {s: run_seed(s).digest for s in (1, 4)}
    parallel = {r.seed: r.digest for r in run_many([1, 4], jobs=2)}
    assert parallel == serial
