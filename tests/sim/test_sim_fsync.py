"""Failed fsyncs in the whole-cluster simulation (issue 10; storage.engine.diskfail): the
"fsync" profile adds a fault that fails one commit's fsync on a target, which leaves service
(reported OFFLINE, out of its chain) until its process restarts and resyncs. Every invariant
(no acked write lost, a version names one content, nothing uncommitted served, chains
converge) holds on each seed. ``LOOMFS_SIM_FSYNC_SEEDS`` sizes the run."""

from __future__ import annotations

import os

import pytest

from loomfs.testing.sim.runner import run_many, run_seed

SEEDS = int(os.environ.get("LOOMFS_SIM_FSYNC_SEEDS", "30"))
JOBS = int(os.environ.get("LOOMFS_SIM_JOBS", "0")) or min(4, os.cpu_count() or 1)


@pytest.mark.timeout(600)
def test_fsync_failures_keep_every_invariant() -> None:
    results = run_many(range(120_000, 120_000 + SEEDS), "fsync", jobs=JOBS)
    failed = [r for r in results if not r.ok]
    assert not failed, f"{len(failed)} of {len(results)} seeds failed:\n" + "\n".join(r.summary() for r in failed[:10])


@pytest.mark.timeout(120)
def test_a_failed_target_leaves_and_returns_by_resync() -> None:
    r = run_seed(120_000, "fsync", keep_trace=True)
    assert r.ok, r.summary()
    assert any("fails its next commit's fsync" in line for line in r.trace)
    assert any("failed: restarting the process" in line for line in r.trace)  # the fault hit a commit
    assert r.stats["acked"] == r.stats["ops"]


@pytest.mark.timeout(120)
def test_a_failed_target_whose_marker_was_refused_is_verified_for_mgmtd() -> None:
    """Reviewer's R5 in the simulation: the failing disk refused the FSYNC_FAILED marker too and
    lost the pages of a committed chunk; the restarted process registers the target SERVING,
    unverified. mgmtd keeps it out of its chain and asks the node to verify it; the lost chunk
    is found and repaired from the chain (convergence checks every replica's bytes)."""
    r = run_seed(120_017, "fsync", keep_trace=True)
    assert r.ok, r.summary()
    assert sum("(its marker refused)" in line for line in r.trace) >= 1
