"""Injected time, so protocol logic can run in virtual time under the simulator."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def now_ns(self) -> int: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def now_ns(self) -> int:
        return time.time_ns()

    def __repr__(self) -> str:
        return "SystemClock()"


class ManualClock:
    """A clock tests move by hand."""

    def __init__(self, start_s: float = 1_000.0, wall_ns: int = 1_700_000_000 * 10**9):
        self._t = start_s
        self._wall0 = wall_ns
        self._t0 = start_s

    def monotonic(self) -> float:
        return self._t

    def now_ns(self) -> int:
        return self._wall0 + int((self._t - self._t0) * 1e9)

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time only moves forward")
        self._t += seconds

    def __repr__(self) -> str:
        return f"ManualClock(t={self._t:.3f})"


class LoopClock:
    """The running event loop's clock: ``monotonic()`` is ``loop.time()``.

    Under asyncio's default loop that is ``time.monotonic()``; under the simulator's
    virtual-time loop it is virtual time, so code that sleeps and measures on the loop agrees
    with itself either way. Outside a running loop it falls back to the system clock.
    ``now_ns`` is a fixed wall-clock origin plus loop time (deterministic under simulation).
    """

    def __init__(self, wall_origin_ns: int = 1_700_000_000 * 10**9):
        self.wall_origin_ns = wall_origin_ns

    def monotonic(self) -> float:
        try:
            return asyncio.get_running_loop().time()
        except RuntimeError:
            return time.monotonic()

    def now_ns(self) -> int:
        return self.wall_origin_ns + int(self.monotonic() * 1e9)

    def __repr__(self) -> str:
        return "LoopClock()"


SYSTEM_CLOCK = SystemClock()
LOOP_CLOCK = LoopClock()
