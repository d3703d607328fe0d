"""The checkpoint bench waits for the cluster's GC to be quiet before each phase."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from loomfs.bench.checkpoint import wait_quiet


@dataclass
class _St:
    gc_pending: int
    trims_pending: int = 0


class _Fs:
    """statfs answers from a script; the clock advances by each sleep."""

    def __init__(self, script: list[_St]):
        self.script = script
        self.calls = 0

    def statfs(self) -> _St:
        st = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        return st


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def test_waits_until_gc_queue_and_trims_are_empty_then_syncs() -> None:
    fs = _Fs([_St(3), _St(2, 1), _St(0, 1), _St(0, 0), _St(5)])
    clk = _Clock()
    synced: list[int] = []
    waited = wait_quiet(fs, poll_s=0.5, sync=lambda: synced.append(fs.calls), clock=clk, sleep=clk.sleep)
    assert fs.calls == 4  # stopped at the first empty answer, not before
    assert synced == [4]  # the page cache is flushed after the cluster went quiet
    assert waited == pytest.approx(1.5)


def test_quiet_cluster_costs_one_statfs() -> None:
    fs = _Fs([_St(0)])
    clk = _Clock()
    assert wait_quiet(fs, sync=lambda: None, clock=clk, sleep=clk.sleep) == 0.0
    assert fs.calls == 1


def test_gives_up_after_the_timeout() -> None:
    fs = _Fs([_St(1)])  # a file held open keeps its GC entry
    clk = _Clock()
    with pytest.raises(TimeoutError, match="1 GC entries"):
        wait_quiet(fs, timeout_s=2.0, poll_s=0.5, sync=lambda: None, clock=clk, sleep=clk.sleep)
