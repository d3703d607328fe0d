"""Resource limits of an RPC server and the sweeper that enforces the time-based ones.

Byte and count limits are checked where frames arrive (``rpc._ServerConnection``); the
sweeper runs a few times per shortest timeout and closes connections that are idle too
long, never send a first frame, or leave a frame half sent (slow-loris), and takes the
receive buffer back from connections that have been idle a while. It reads only counters
the hot path already keeps, so a request costs no clock reads for this.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

logger = logging.getLogger(__name__)

IDLE_TIMEOUT_S = 600.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerLimits:
    inflight_per_connection_max: int = 512  # requests; reading pauses at the bound
    inflight_bytes_per_connection_max: int = 256 << 20  # payload + header bytes of one connection
    connections_max: int = 4096  # more are refused with TOO_MANY_CONNECTIONS
    idle_timeout_s: float = IDLE_TIMEOUT_S  # no request for this long: closed (clients reconnect)
    first_frame_timeout_s: float = 30.0  # a new connection must send a frame by then
    frame_timeout_s: float = 60.0  # a frame begun must be complete by then (slow-loris)
    buffer_release_s: float = 5.0  # idle this long: the receive buffer goes back to the pool

    @property
    def sweep_interval_s(self) -> float:
        shortest = min(self.idle_timeout_s, self.first_frame_timeout_s, self.frame_timeout_s,
                       self.buffer_release_s)
        return max(0.02, min(1.0, shortest / 4))


class Swept(Protocol):
    """What the sweeper needs from a server connection."""

    frames_in: int
    inflight: int
    seen_frames: int
    active_at: float
    partial_since: float | None

    @property
    def reading_held(self) -> bool:
        """We stopped reading (limits): the peer is neither idle nor slow."""
        ...

    def partial_frame(self) -> bool: ...

    def release_buffer(self) -> None: ...

    def close_for(self, reason: str) -> None: ...


def sweep_once(conns: Iterable[Swept], limits: ServerLimits, now: float) -> None:
    for c in list(conns):
        frames = c.frames_in
        if frames != c.seen_frames or c.inflight or c.reading_held:
            c.seen_frames = frames
            c.active_at = now
            c.partial_since = None
            continue
        if c.partial_frame():
            if c.partial_since is None:
                c.partial_since = now
            elif now - c.partial_since >= limits.frame_timeout_s:
                c.close_for(f"frame not completed within {limits.frame_timeout_s:g}s")
            continue
        c.partial_since = None
        idle_s = now - c.active_at
        limit_s = limits.first_frame_timeout_s if frames == 0 else limits.idle_timeout_s
        if idle_s >= limit_s:
            c.close_for(f"idle for {idle_s:.0f}s")
        elif idle_s >= limits.buffer_release_s:
            c.release_buffer()


async def sweep_forever(conns: Callable[[], Iterable[Swept]], limits: ServerLimits) -> None:
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(limits.sweep_interval_s)
        try:
            sweep_once(conns(), limits, loop.time())
        except Exception:  # never let the sweeper die silently
            logger.exception("connection sweep failed")
