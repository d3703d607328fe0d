"""Many seeds of the whole-cluster simulation (issue 8): every invariant holds on each.

``LOOMFS_SIM_SEEDS`` (default 1000) and ``LOOMFS_SIM_JOBS`` (default: CPUs, at most 4) size
the run; ``python -m loomfs.testing.sim --seeds 100000 --jobs 16`` is the soak. Each failure
prints the one command that replays it.
"""

from __future__ import annotations

import os
import time

import pytest

from loomfs.testing.sim.runner import SimResult, run_many

SEEDS = int(os.environ.get("LOOMFS_SIM_SEEDS", "1000"))
JOBS = int(os.environ.get("LOOMFS_SIM_JOBS", "0")) or min(4, os.cpu_count() or 1)


@pytest.fixture(scope="module")
def results() -> list[SimResult]:
    started = time.perf_counter()
    out = run_many(range(SEEDS), "ci", jobs=JOBS)
    elapsed = time.perf_counter() - started
    failed = [r for r in out if not r.ok]
    print(f"\nsimulated {SEEDS} seeds in {elapsed:.1f}s: {SEEDS / elapsed:.1f} seeds/s with {JOBS} jobs, "
          f"{len(failed)} failed: {' '.join(str(r.seed) for r in failed[:50])}")
    return out


@pytest.mark.timeout(1800)
def test_every_seed_runs_to_its_checks(results: list[SimResult]) -> None:
    """The harness itself never breaks: no stall, no task outliving its host, no real clock."""
    broken = [r for r in results if any(v.invariant == "harness" for v in r.violations)]
    assert not broken, "\n".join(r.summary() for r in broken[:10])
    assert len(results) == SEEDS


@pytest.mark.timeout(1800)
def test_every_invariant_holds(results: list[SimResult]) -> None:
    failed = [r for r in results if not r.ok]
    assert not failed, f"{len(failed)} of {len(results)} seeds failed:\n" + "\n".join(
        r.summary() for r in failed[:10])
