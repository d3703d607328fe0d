"""The event trace of a run: faults, client ops and chain changes, one line each, in order.

Two runs of one seed must produce the same lines (the determinism test compares digests), so
a line holds only what the seed decides: virtual times, ids, sizes, statuses; never object
ids, wall times or anything hashed by ``PYTHONHASHSEED``.
"""

from __future__ import annotations

import asyncio
import hashlib
import sys


class EventLog:
    def __init__(self, *, echo: bool = False):
        self.lines: list[str] = []
        self.echo = echo

    def add(self, what: str) -> None:
        try:
            now = asyncio.get_running_loop().time()
        except RuntimeError:
            now = 0.0
        line = f"{now:11.6f} {what}"
        self.lines.append(line)
        if self.echo:
            print(line, file=sys.stderr)

    def digest(self) -> str:
        h = hashlib.sha256()
        for line in self.lines:
            h.update(line.encode())
            h.update(b"\n")
        return h.hexdigest()[:16]

    def tail(self, n: int = 40) -> list[str]:
        return self.lines[-n:]

    def __len__(self) -> int:
        return len(self.lines)

    def __repr__(self) -> str:
        return f"EventLog({len(self.lines)} lines)"
