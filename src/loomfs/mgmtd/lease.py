"""mgmtd primary election by a lease row in a shared store (docs/mgmtd-ha.md).

Every mgmtd process runs an ``Election``: ``step()`` tries to acquire or renew the lease
(one conditional update in the store: granted when the row is free, expired, or already
ours; the store's own clock sets the expiry). Holding it, the process is primary until
``primary_until_s``: the local monotonic time *before* the renewal was sent, plus the lease,
minus a margin. The store's expiry is later than that (it was computed after the request left),
so a primary that stops renewing (dead, paused, cut off) stops answering as primary before any
standby can acquire the row. Every state save is conditional on the lease in the same
statement (``HaStore.save``), so even a primary paused between its check and its write cannot
write once another process holds the lease.

``MemoryHaStore`` implements the store's rules on a ``Clock`` (the unit tests, on a
``ManualClock``); ``loomfs.mgmtd.pgstore.PgHaStore`` is the PostgreSQL one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

from loomfs.common.clock import Clock
from loomfs.mgmtd.state import ClusterState
from loomfs.mgmtd.store import Row, decode_rows, encode_rows

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LeaseView:
    held: bool  # the caller holds the lease now
    address: str  # the holder's RPC address ("" when nobody holds it)


class HaStore(Protocol):
    async def acquire(self, holder: str, address: str, lease_s: float) -> LeaseView:
        """Take or renew the lease unless another holder's lease is still running."""
        ...

    async def release(self, holder: str) -> None:
        """Expire the lease now if ``holder`` holds it (a clean shutdown)."""
        ...

    async def load(self, state: ClusterState, now_s: float) -> None: ...

    async def save(self, state: ClusterState, holder: str) -> bool:
        """Write ``state`` if ``holder`` holds an unexpired lease (checked in the same
        transaction); False, and nothing written, otherwise."""
        ...

    async def close(self) -> None: ...


class MemoryHaStore:
    """The lease rules in memory on ``clock`` (the "database clock"): for unit tests."""

    def __init__(self, clock: Clock):
        self.clock = clock
        self.holder = ""
        self.address = ""
        self.expires_s = 0.0
        self.rows: list[Row] = []
        self.saves = 0
        self.refused_saves = 0
        self.down = False  # every call raises OSError (the database cannot be reached)

    def _check(self) -> None:
        if self.down:
            raise ConnectionRefusedError("store down")

    async def acquire(self, holder: str, address: str, lease_s: float) -> LeaseView:
        self._check()
        now = self.clock.monotonic()
        if self.holder == holder or self.expires_s <= now:
            self.holder, self.address, self.expires_s = holder, address, now + lease_s
            return LeaseView(True, address)
        return LeaseView(False, self.address)

    async def release(self, holder: str) -> None:
        self._check()
        if self.holder == holder:
            self.expires_s = 0.0

    async def load(self, state: ClusterState, now_s: float) -> None:
        self._check()
        decode_rows(self.rows, state, now_s)

    async def save(self, state: ClusterState, holder: str) -> bool:
        self._check()
        if self.holder != holder or self.expires_s <= self.clock.monotonic():
            self.refused_saves += 1
            return False
        self.rows = encode_rows(state)
        self.saves += 1
        return True

    async def close(self) -> None:
        pass


class Election:
    """One process's view of the lease. ``term`` counts the times it became primary: the
    state must be (re)loaded from the store whenever it changes."""

    def __init__(self, store: HaStore, *, holder: str, address: str, lease_s: float, clock: Clock,
                 margin_s: float | None = None):
        if lease_s <= 0:
            raise ValueError(f"lease_s must be positive, got {lease_s}")
        self.store = store
        self.holder = holder
        self.address = address
        self.lease_s = lease_s
        self.clock = clock
        # clock rates differ a little, and the answer to a renewal may come late
        self.margin_s = lease_s / 5 if margin_s is None else margin_s
        self.primary_until_s = 0.0
        self.primary_address = ""  # the holder's address as last read (the hint for callers)
        self.term = 0
        self.step_errors = 0

    @property
    def is_primary(self) -> bool:
        return self.clock.monotonic() < self.primary_until_s

    def hint(self) -> str:
        """Where the primary is, as far as this process knows ("" = unknown)."""
        if self.is_primary:
            return self.address
        return "" if self.primary_address == self.address else self.primary_address

    async def step(self) -> bool:
        """One acquire-or-renew; True when this process has just become primary."""
        was = self.is_primary
        sent_s = self.clock.monotonic()
        try:
            view = await self.store.acquire(self.holder, self.address, self.lease_s)
        except OSError as exc:  # the store is unreachable: primary until the local deadline only
            self.step_errors += 1
            logger.warning("mgmtd lease: store unreachable (%s); primary for %.2fs more", exc,
                           max(0.0, self.primary_until_s - self.clock.monotonic()))
            return False
        self.primary_address = view.address
        if not view.held:
            if was:
                logger.warning("mgmtd lease lost to %s", view.address)
            self.primary_until_s = 0.0
            return False
        self.primary_until_s = sent_s + self.lease_s - self.margin_s
        if was:
            return False
        self.term += 1
        logger.info("mgmtd %s is primary (term %d)", self.address, self.term)
        return True

    def lost(self) -> None:
        """A conditional save was refused (or failed): stop answering as primary now."""
        self.primary_until_s = 0.0

    async def release(self) -> None:
        if self.is_primary:
            self.primary_until_s = 0.0
            await self.store.release(self.holder)

    def __repr__(self) -> str:
        role = "primary" if self.is_primary else f"standby (primary {self.primary_address or '?'})"
        return f"Election({self.address} {role} term={self.term})"
