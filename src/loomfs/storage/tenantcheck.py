"""Storage's tenant check: a token confined to a tenant touches only that tenant's chunks.

Storage has no namespace, but a chunk id carries its file's inode, and a tenant's inodes are
``tenant << TENANT_SHIFT | n`` (``loomfs.meta.tenancy``). So, like Ceph's OSD caps, every
read, write, truncate, removal, listing and corruption report by a client is checked with one
shift and compare against the caller's tenant number: no HMAC, no store read per request.

* Services (chain peers, meta's GC, resync) and admin tokens (repairs, fsck) pass
  (``Identity.privileged``, computed once per connection).
* A tenant-less user token is confined to the shared namespace, tenant 0 (it cannot walk into
  a tenant's tree in meta either).
* A tenant's name is resolved to its number once per storage process by asking meta
  (``resolve``, TENANT_LIST as a service); numbers never change, so the answer is kept. A name
  meta does not know is refused (EACCES) and asked again at most once per ``retry_s``.

Refusals are EACCES with the reason, counted (``refused_total``) and logged like grant refusals
(the first 16, then at 32, 64, ...). Without a cluster secret every caller is TRUSTED
(privileged), and nothing is checked.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable

from loomfs.common.identity import TENANT_SHIFT, Identity
from loomfs.errors import StatusError
from loomfs.wire.status import Status

logger = logging.getLogger(__name__)

Resolver = Callable[[str], Awaitable["int | None"]]
# unknown names remembered (for retry_s); known ones are real tenants, at most TENANT_MAX (32767)
UNKNOWN_MAX = 4096


class TenantCheck:
    def __init__(self, resolve: Resolver | None = None, *, retry_s: float = 1.0,
                 monotonic: Callable[[], float] = time.monotonic):
        self.resolve = resolve  # tenant name -> number (None: no such tenant); the server sets it
        self.retry_s = retry_s
        self.monotonic = monotonic
        self.numbers: dict[str, int] = {"": 0}
        self._unknown_until: dict[str, float] = {}  # name -> when meta may be asked again
        self._lookups: dict[str, asyncio.Future[int | None]] = {}
        self.refused_total = 0
        self.lookups_total = 0

    def check(self, identity: Identity, inodes: Iterable[int], what: str) -> bool:
        """Raise EACCES if a confined ``identity`` names an inode outside its tenant's range.
        False when the tenant's number is not known yet: then ``await check_slow(...)``.
        Callers skip this for privileged identities (``Identity.privileged``)."""
        n = self.numbers.get(identity.tenant)
        if n is None:
            return False
        for inode in inodes:
            if inode >> TENANT_SHIFT != n:
                self._refuse(identity, f"{what} of inode {inode}: outside tenant "
                             f"{identity.tenant or '(shared namespace)'!r} (token {identity.token_id})")
        return True

    async def check_slow(self, identity: Identity, inodes: Iterable[int], what: str) -> None:
        """``check`` after learning the tenant's number from meta (EACCES if meta knows none)."""
        if identity.privileged:
            return
        if identity.tenant not in self.numbers:
            await self._lookup(identity.tenant)
            if identity.tenant not in self.numbers:
                self._refuse(identity, f"{what}: tenant {identity.tenant!r} does not exist "
                             f"(token {identity.token_id})")
        self.check(identity, inodes, what)

    async def _lookup(self, name: str) -> None:
        if self.monotonic() < self._unknown_until.get(name, 0.0) or self.resolve is None:
            return
        running = self._lookups.get(name)
        if running is None:  # one question to meta per name at a time
            running = self._lookups[name] = asyncio.ensure_future(self._ask(name))
        number = await asyncio.shield(running)
        if number is not None:
            self.numbers[name] = number

    async def _ask(self, name: str) -> int | None:
        assert self.resolve is not None
        self.lookups_total += 1
        try:
            number = await self.resolve(name)
        except Exception as exc:  # meta unreachable: refuse for now, ask again later
            logger.warning("could not learn tenant %r's number from meta: %s", name, exc)
            number = None
        finally:
            self._lookups.pop(name, None)
        if number is None:
            if len(self._unknown_until) >= UNKNOWN_MAX:
                self._unknown_until.clear()
            self._unknown_until[name] = self.monotonic() + self.retry_s
        return number

    def _refuse(self, identity: Identity, reason: str) -> None:
        self.refused_total += 1
        n = self.refused_total
        if n <= 16 or n & (n - 1) == 0:
            logger.warning("refused %s (%d refused so far)", reason, n)
        raise StatusError(Status.EACCES, reason)

    def __repr__(self) -> str:
        return f"TenantCheck(tenants={len(self.numbers) - 1} refused={self.refused_total})"
