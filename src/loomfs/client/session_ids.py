"""Write-session ids the client picks for its opens: ``(1 << 62)`` | 62 random bits.

A session lets its holder write the file (meta checks the id, not the permission bits, for
its writes), so the ids must be unguessable: they come from the OS's random source, as
``secrets.randbits`` gives them, but ``IDS_PER_READ`` at a time (one ``getrandom`` per 64
small-file puts instead of one each: ~2 us of a put's client CPU here). Safe from any thread
(``deque`` appends and pops are atomic); a forked child starts with an empty pool, so it never
hands out an id its parent also holds.
"""

from __future__ import annotations

import os
import struct
from collections import deque

IDS_PER_READ = 64
_HIGH_BIT = 1 << 62
_LOW_MASK = _HIGH_BIT - 1
_UNPACK = struct.Struct(f"<{IDS_PER_READ}Q").unpack


class SessionIds:
    """A pool of unused session ids (``take``)."""

    def __init__(self) -> None:
        self._pool: deque[int] = deque()
        self.reads = 0  # random reads so far

    def take(self) -> int:
        try:
            return self._pool.popleft()
        except IndexError:
            pass
        self.reads += 1
        ids = [_HIGH_BIT | (v & _LOW_MASK) for v in _UNPACK(os.urandom(8 * IDS_PER_READ))]
        first = ids.pop()
        self._pool.extend(ids)
        return first

    def forget(self) -> None:
        """Drop the pool (a forked child must not reuse its parent's ids)."""
        self._pool.clear()

    def __repr__(self) -> str:
        return f"SessionIds(pooled={len(self._pool)} reads={self.reads})"


session_ids = SessionIds()
os.register_at_fork(after_in_child=session_ids.forget)
