"""Planted bugs: the replication defects of issue 8, re-introduced behind debug flags.

They exist so the simulator can prove it finds each of them (tests/sim assert how many seeds
it takes). Nothing sets them in production: the set is empty unless a test (or
``$LOOMFS_PLANTED_BUGS``, comma-separated, for a replay) names some.

* ``forward_before_stage`` — the head forwards before staging and gives the version up when
  its own stage fails (defect 1);
* ``stage_fails`` — every non-replace local stage fails with EIO (used with the above);
* ``no_content_check`` — successors accept a "duplicate" or a diverged result without
  comparing content (defect 1);
* ``unfenced_resync`` — resync copies are accepted from anyone, for any chain version, even
  rolling a chunk back, and the source checks neither its lease nor its routing (defect 2);
* ``tail_ignores_leftover`` — a new tail serves the committed version past a leftover pending
  one, and nothing pushes leftovers down after a chain change (defect 3);
* ``syncing_commits_leftover`` — a target back in its chain as syncing commits a pending
  version from before it left (found by the simulator);
* ``syncing_drops_leftover`` — ... or drops it, although it may be the only intact copy of a
  version the old tail committed and lost to a torn write (sim seed 151227);
* ``no_chunk_tags`` — retries are deduplicated only by the head's memory (defect 4);
* ``reads_ignore_lease`` — a replica serves reads after its lease lapsed, before it
  registered, after mgmtd revoked it, and with a lease granted before it fetched the routing of
  that grant (defect 5).
"""

from __future__ import annotations

import os

KNOWN = frozenset({
    "forward_before_stage", "stage_fails", "no_content_check", "unfenced_resync", "tail_ignores_leftover",
    "no_chunk_tags", "reads_ignore_lease", "syncing_commits_leftover", "syncing_drops_leftover",
})

PLANTED: set[str] = {b for b in os.environ.get("LOOMFS_PLANTED_BUGS", "").split(",") if b}


def on(name: str) -> bool:
    return bool(PLANTED) and name in PLANTED


def plant(*names: str) -> None:
    unknown = set(names) - KNOWN
    if unknown:
        raise ValueError(f"unknown planted bugs: {sorted(unknown)}")
    PLANTED.update(names)


def clear() -> None:
    PLANTED.clear()
