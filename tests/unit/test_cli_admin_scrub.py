"""``loomfs admin targets``: the scrub column (issue 15 item 7)."""

from __future__ import annotations

from loomfs.cli.admin import scrub_summary
from loomfs.wire.types import ScrubStats


def test_scrub_summary() -> None:
    now = 1_000_000.0
    assert scrub_summary(None, now) == ""
    assert scrub_summary(ScrubStats(), now) == "off"
    waiting = ScrubStats(interval_s=3600, next_pass_unix_s=now + 720)
    assert scrub_summary(waiting, now) == "every 1.0h, next in 12m, 0 bad"
    done = ScrubStats(interval_s=600, passes=3, bad=2, repaired=2, last_pass_end_unix_s=now - 30,
                      next_pass_unix_s=now + 570)
    assert scrub_summary(done, now) == "every 10m, next in 10m, last 30s ago, 2 bad (2 repaired)"
    assert scrub_summary(ScrubStats(interval_s=600, next_pass_unix_s=0.0), now) == "every 10m, running, 0 bad"
