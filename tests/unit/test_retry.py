"""The one backoff policy (issue 15 item 13)."""

from __future__ import annotations

import random

from loomfs.common.retry import Backoff


def test_backoff_doubles_with_jitter_and_is_capped() -> None:
    b = Backoff(0.1, 1.0)
    rng = random.Random(4)
    for attempt, base in [(0, 0.1), (1, 0.2), (2, 0.4), (3, 0.8), (4, 1.0), (60, 1.0)]:
        delays = [b.delay_s(attempt, rng) for _ in range(200)]
        assert base / 2 <= min(delays) and max(delays) <= base
        assert max(delays) - min(delays) > base / 4  # jittered, not fixed
    assert b.delay_s(-3, rng) <= 0.1


def test_every_retry_loop_uses_it() -> None:
    """The RPC client's policy is the same arithmetic (one place to change)."""
    from loomfs.net.rpc import RetryPolicy

    p = RetryPolicy(backoff_initial_s=0.05, backoff_max_s=2.0)
    assert p.delay_s(3, random.Random(1)) == Backoff(0.05, 2.0).delay_s(3, random.Random(1))
