"""Per-process and per-tenant byte budgets for request payloads in flight on RPC servers.

A server reserves a request's bytes before it allocates a buffer for its payload. When the
budget is spent, the connection stops reading from its socket (TCP then pushes back on the
sender) and waits in a FIFO queue; bytes given back wake waiters in order. A request larger
than the whole budget is still admitted when nothing else is in flight, so no frame the
transport accepts can wait forever. Single-threaded (one event loop per process).

Each tenant's connections (every token naming that tenant; tenant-less user tokens are the
shared namespace's tenant "") also share a budget of their own (``TenantBudgets``, default half
the process budget), taken before the process's: one tenant cannot hold the whole process
budget, so another tenant's requests are still read. Services and admin tokens have no tenant
budget (chain forwarding, resync and repairs are limited by the process budget alone).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable

DEFAULT_BUDGET_BYTES = 1 << 30
ENV_VAR = "LOOMFS_INFLIGHT_BUDGET_BYTES"
TENANT_ENV_VAR = "LOOMFS_TENANT_INFLIGHT_BUDGET_BYTES"  # default: half the process budget


class ByteBudget:
    def __init__(self, limit_bytes: int):
        if limit_bytes <= 0:
            raise ValueError("a byte budget must be positive")
        self.limit_bytes = limit_bytes
        self.used_bytes = 0
        self.peak_bytes = 0
        self.waits_total = 0
        self.waiters: deque[tuple[int, Callable[[], None]]] = deque()

    def try_acquire(self, n: int) -> bool:
        """Take ``n`` bytes now if they fit (and nobody is queued ahead)."""
        if self.waiters or (self.used_bytes and self.used_bytes + n > self.limit_bytes):
            return False
        self.used_bytes += n
        if self.used_bytes > self.peak_bytes:
            self.peak_bytes = self.used_bytes
        return True

    def force(self, n: int) -> None:
        """Take ``n`` bytes whether or not they fit (a header already received)."""
        self.used_bytes += n
        if self.used_bytes > self.peak_bytes:
            self.peak_bytes = self.used_bytes

    @property
    def exhausted(self) -> bool:
        return self.used_bytes >= self.limit_bytes

    def wait(self, n: int, granted: Callable[[], None]) -> Callable[[], None]:
        """Queue for ``n`` bytes; ``granted()`` runs once they are taken on the caller's
        behalf. Returns a function that withdraws the request (if not yet granted)."""
        entry = (n, granted)
        self.waiters.append(entry)
        self.waits_total += 1

        def cancel() -> None:
            try:
                self.waiters.remove(entry)
            except ValueError:
                pass

        return cancel

    def release(self, n: int) -> None:
        self.used_bytes -= n
        assert self.used_bytes >= 0, "byte budget released more than it gave"
        if self.waiters:
            self.wake()

    def wake(self) -> None:
        """Grant queued requests that fit now (after ``used_bytes`` went down)."""
        while self.waiters:
            need, granted = self.waiters[0]
            if self.used_bytes and self.used_bytes + need > self.limit_bytes:
                break
            self.waiters.popleft()
            self.force(need)
            granted()

    @property
    def waiting(self) -> int:
        return len(self.waiters)

    def __repr__(self) -> str:
        return (
            f"ByteBudget(used={self.used_bytes} limit={self.limit_bytes} waiting={len(self.waiters)} "
            f"peak={self.peak_bytes})"
        )


class TenantBudgets:
    """One ``ByteBudget`` of ``limit_bytes`` per tenant with connections (or bytes) in flight.
    ``attach(name)`` when a connection authenticates as a tenant's token, ``detach(name)`` when
    it closes; a budget goes away once no connection holds it and nothing is in flight."""

    def __init__(self, limit_bytes: int):
        if limit_bytes <= 0:
            raise ValueError("a tenant byte budget must be positive")
        self.limit_bytes = limit_bytes
        self._budgets: dict[str, ByteBudget] = {}
        self._holders: dict[str, int] = {}  # connections per tenant

    def attach(self, tenant: str) -> ByteBudget:
        b = self._budgets.get(tenant)
        if b is None:
            b = self._budgets[tenant] = ByteBudget(self.limit_bytes)
        self._holders[tenant] = self._holders.get(tenant, 0) + 1
        return b

    def detach(self, tenant: str) -> None:
        left = self._holders.get(tenant, 0) - 1
        if left > 0:
            self._holders[tenant] = left
            return
        self._holders.pop(tenant, None)
        # requests still in flight release into the same object, and a new connection of this
        # tenant must share it: dropped only when empty (else at the tenant's next detach; at
        # most one budget per tenant is ever kept)
        b = self._budgets.get(tenant)
        if b is not None and not b.used_bytes and not b.waiters:
            del self._budgets[tenant]

    def get(self, tenant: str) -> ByteBudget | None:
        return self._budgets.get(tenant)

    def __len__(self) -> int:
        return len(self._budgets)

    def __repr__(self) -> str:
        return f"TenantBudgets(limit={self.limit_bytes} tenants={len(self._budgets)})"


def _limit_from_env(var: str, default: int) -> int:
    text = os.environ.get(var, "")
    try:
        value = int(text) if text else default
    except ValueError:
        value = default
    return value if value > 0 else default


def _default_limit() -> int:
    return _limit_from_env(ENV_VAR, DEFAULT_BUDGET_BYTES)


PROCESS_BUDGET = ByteBudget(_default_limit())
TENANT_BUDGETS = TenantBudgets(_limit_from_env(TENANT_ENV_VAR, max(1, PROCESS_BUDGET.limit_bytes // 2)))
