"""An asyncio event loop on virtual time, for the simulator.

When nothing is ready to run, the loop jumps its clock to the next timer instead of
sleeping, so ``asyncio.sleep(60)`` takes no wall time and a run depends only on the
program and its seeds, not on how fast the machine is. Use it for code that talks through
``net.sim`` (no real sockets): ``asyncio.Runner(loop_factory=VirtualTimeLoop)``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self, start_s: float = 0.0) -> None:
        super().__init__()
        self._virtual_s = start_s

    def time(self) -> float:
        return self._virtual_s

    def _run_once(self) -> None:
        ready = self._ready  # type: ignore[attr-defined]
        scheduled = self._scheduled  # type: ignore[attr-defined]
        if not ready and scheduled:
            when = scheduled[0]._when
            if when > self._virtual_s:
                self._virtual_s = when
        super()._run_once()  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"VirtualTimeLoop(t={self._virtual_s:.6f})"


def run_virtual(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on a fresh virtual-time loop."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(coro)
