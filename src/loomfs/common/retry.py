"""One retry policy for every loop that waits before trying again: jittered exponential
backoff (attempt 0 waits initial/2..initial, each next one up to twice as long, capped at
``max_s``), used under a deadline or an attempt budget by the caller.

Used by the RPC client (idempotent methods), the storage client (chain calls), the meta client
(re-sends), resync progress reports, node registration and engine install retries, so a
change of policy (or the simulator's seeded jitter) reaches all of them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    initial_s: float = 0.05
    max_s: float = 2.0
    # full jitter (0..base instead of base/2..base): for many contenders re-running after the
    # same conflict, so they spread out (meta's transaction re-runs)
    full_jitter: bool = False

    def delay_s(self, attempt: int, rng: random.Random | None = None) -> float:
        """How long to wait after failed attempt number ``attempt`` (0-based)."""
        base = min(self.max_s, self.initial_s * 2 ** min(max(attempt, 0), 30))
        r = rng.random() if rng is not None else random.random()
        return base * r if self.full_jitter else base * (0.5 + r / 2)
