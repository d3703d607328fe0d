"""The "blocks" simulation profile: chunks of 2.5 CRC blocks (160 KiB, BLOCK_BYTES 64 KiB) and
writes up to 16 KiB, so overwrites keep whole blocks, appends carry earlier blocks unread, bit
rot hits blocks other than the last, and the scrubber's block-level rebuild
(storage/blockrepair.py) runs. Every invariant holds on each seed. ``LOOMFS_SIM_BLOCKS_SEEDS``
sizes the run."""

from __future__ import annotations

import logging
import os

import pytest

from loomfs.testing.sim.runner import run_many, run_seed

SEEDS = int(os.environ.get("LOOMFS_SIM_BLOCKS_SEEDS", "40"))
JOBS = int(os.environ.get("LOOMFS_SIM_JOBS", "0")) or min(4, os.cpu_count() or 1)


@pytest.mark.timeout(600)
def test_multi_block_chunks_keep_every_invariant() -> None:
    results = run_many(range(235_000, 235_000 + SEEDS), "blocks", jobs=JOBS)
    failed = [r for r in results if not r.ok]
    assert not failed, f"{len(failed)} of {len(results)} seeds failed:\n" + "\n".join(r.summary() for r in failed[:10])


class _Rebuilds(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "rebuilt from other members' copies" in record.getMessage():
            self.count += 1


@pytest.mark.timeout(300)
def test_the_block_rebuild_runs_in_the_simulation() -> None:
    """Not a profile that only looks multi-block: in the first seeds the rebuild repairs a
    chunk at least once, and those seeds keep every invariant."""
    seen = _Rebuilds()
    log = logging.getLogger("loomfs.storage.blockrepair")
    log.addHandler(seen)
    try:
        for seed in range(235_700, 235_760):
            r = run_seed(seed, "blocks", verbose=True)
            assert r.ok, r.summary()
            if seen.count:
                break
    finally:
        log.removeHandler(seen)
    assert seen.count >= 1
