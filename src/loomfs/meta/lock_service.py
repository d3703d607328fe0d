"""RPC adapter for locks (``loomfs.wire.meta_lock``, methods 70-73): decode, ``LockTable``,
encode. Mixed into ``MetaService`` (so every meta server answers them); each operation re-runs
on a lost PostgreSQL conflict (``retry_conflicts``). The rules are in ``loomfs.meta.locks``.
Every call hands ``LockTable`` the connection's identity (``ctx.identity``, never the request
body): a user's client ids are bound to that user (``bound_client_id``), so a request naming
another user's client acts on a client of its own; the lock in the way is shown as
``shown_to`` says (another client's id and owner hidden from unprivileged callers).
"""

from __future__ import annotations

import logging
from typing import Any

from loomfs.errors import StatusError
from loomfs.meta import tenancy
from loomfs.meta.locks import LockTable, bound_client_id
from loomfs.meta.store.base import LockRow
from loomfs.net.rpc import CallContext, handles
from loomfs.wire import meta_lock as wl
from loomfs.wire.status import Status
from loomfs.wire.types import ROOT_INODE

logger = logging.getLogger(__name__)


def _info(row: LockRow | None) -> wl.LockInfo | None:
    if row is None:
        return None
    return wl.LockInfo(client_id=row.client_id, owner=row.owner, type=row.type, first=row.first, last=row.last,
                       pid=row.pid)


class LockHandlers:
    """``self.ns``: the (conflict-retrying) namespace, for its store and clock."""

    ns: Any
    _lock_table: LockTable | None = None

    @property
    def locks(self) -> LockTable:
        if self._lock_table is None:
            self._lock_table = LockTable(self.ns.store, self.ns.clock)
        return self._lock_table

    async def _confine(self, ctx: CallContext, inode: int) -> int:
        """A lock names its file by inode number: ENOENT outside the caller's tenant (as every
        call by number; PostgreSQL hunt, session 14: lock calls were not confined). Returns
        the inode to lock: a tenant's inode 1 is its own root (a mount's root is FUSE inode 1)."""
        who = ctx.identity
        if who.privileged:
            return inode
        if not who.tenant:  # the shared namespace: no lookup
            if tenancy.tenant_of(inode) != 0:
                raise StatusError(Status.ENOENT, f"inode {inode}")
            return inode
        async with self.ns.store.read() as txn:
            if inode == ROOT_INODE:
                return tenancy.root_of(await tenancy.tenant_number(txn, who.tenant))
            await tenancy.confine(txn, who.tenant, inode)
        return inode

    async def _retrying(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from loomfs.meta.service import retry_conflicts

        return await retry_conflicts(fn, *args, **kwargs)

    @handles(wl.LOCK_SET)
    async def lock_set(self, req: wl.LockReq, ctx: CallContext) -> wl.LockRsp:
        inode = await self._confine(ctx, req.inode)
        who = ctx.identity
        hit, fresh = await self._retrying(self.locks.setlk_lease, inode, req.client_id, req.owner, req.kind,
                                          req.type, req.first, req.last, pid=req.pid, lease_s=req.lease_s, who=who)
        if logger.isEnabledFor(logging.DEBUG):  # (the hash is not free)
            logger.debug("req %d: lock_set inode %d kind %d type %d %d..%d client %#x (kept as %#x) owner %#x: %s",
                         ctx.request_id, req.inode, req.kind, req.type, req.first, req.last, req.client_id,
                         bound_client_id(who, req.client_id), req.owner, "granted" if hit is None else "refused")
        return wl.LockRsp(granted=hit is None, conflict=_info(hit), lease_new=fresh)

    @handles(wl.LOCK_GET)
    async def lock_get(self, req: wl.LockReq, ctx: CallContext) -> wl.LockRsp:
        inode = await self._confine(ctx, req.inode)
        hit = await self.locks.getlk(inode, req.client_id, req.owner, req.kind, req.type, req.first, req.last,
                                     who=ctx.identity)
        return wl.LockRsp(granted=hit is None, conflict=_info(hit))

    @handles(wl.LOCK_RELEASE)
    async def lock_release(self, req: wl.LockReleaseReq, ctx: CallContext) -> wl.LockReleaseRsp:
        inode = await self._confine(ctx, req.inode)
        n = await self._retrying(self.locks.release, inode, req.client_id, req.owner, req.kind, who=ctx.identity)
        return wl.LockReleaseRsp(released=n)

    @handles(wl.LOCK_RENEW)
    async def lock_renew(self, req: wl.LockRenewReq, ctx: CallContext) -> wl.LockRenewRsp:
        who = ctx.identity
        if req.drop:
            n = await self._retrying(self.locks.drop_client, req.client_id, who=who)
            logger.debug("req %d: client %#x (kept as %#x) ended its locks (%d)", ctx.request_id, req.client_id,
                         bound_client_id(who, req.client_id), n)
            return wl.LockRenewRsp(held=False)
        return wl.LockRenewRsp(held=await self._retrying(self.locks.renew, req.client_id, req.lease_s, who=who))
