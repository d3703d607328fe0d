"""RPC adapter: one thin ``@handles`` coroutine per meta method (decode -> ops -> encode).

``ConflictRetrying`` wraps the namespace the services call: an operation whose transaction
lost a serialisation conflict to another meta server (``TxnConflict``, PostgreSQL) is run
again from its start, up to ``CONFLICT_ATTEMPTS`` times with jittered, doubling backoff; the
last loss reaches the client as EAGAIN (which the client's RPC layer retries for idempotent
methods). Only a run that stored nothing is re-run (the engines count the commits of the running
operation, ``OP_COMMITS``): a run whose first transactions committed and whose later one lost
answers EAGAIN rather than apply its first part twice. After ``ALONE_AFTER`` lost runs the operation's writes run alone
(``WRITE_ALONE``), so a busy directory cannot starve it.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import crc32c

from loomfs.common import grants
from loomfs.common.identity import TRUSTED
from loomfs.common.retry import Backoff
from loomfs.errors import StatusError
from loomfs.meta.caller import set_caller
from loomfs.meta.lock_service import LockHandlers
from loomfs.meta.ops.inline import Patch
from loomfs.meta.ops.namespace import Namespace
from loomfs.meta.readgrants import read_grant
from loomfs.meta.store.base import OP_COMMITS, WRITE_ALONE, TxnConflict
from loomfs.net.rpc import CallContext, handles
from loomfs.wire import meta as w
from loomfs.wire.message import Empty
from loomfs.wire.status import Status

logger = logging.getLogger(__name__)

T = TypeVar("T")

CONFLICT_ATTEMPTS = 16
CONFLICT_BACKOFF_S = 0.001  # the first retry waits up to this long, doubling to ..._MAX_S
CONFLICT_BACKOFF_MAX_S = 0.1
ALONE_AFTER = 2  # lost runs before an operation's writes run alone


async def retry_conflicts(fn: Callable[..., Awaitable[T]], *args: Any, attempts: int = CONFLICT_ATTEMPTS,
                          rng: random.Random | None = None, on_retry: Callable[[], None] | None = None,
                          alone_after: int = ALONE_AFTER, **kwargs: Any) -> T:
    """``await fn(*args, **kwargs)``, run again while it raises ``TxnConflict`` having stored
    nothing (at most ``attempts`` runs in all). After ``alone_after`` lost runs its write transactions run
    alone (``WRITE_ALONE``: PostgreSQL lets every other writer wait), so a hot directory
    cannot starve one operation. The first run costs one context variable set (every meta
    request comes through here; a conflict is rare)."""
    if alone_after >= 1:
        commits = [0]
        commits_token = OP_COMMITS.set(commits)
        try:
            return await fn(*args, **kwargs)
        except TxnConflict:
            # a run whose earlier transactions committed is not run again (its effects would
            # apply twice): the caller gets EAGAIN, as for any operation stored in part
            if attempts <= 1 or commits[0]:
                raise
        finally:
            OP_COMMITS.reset(commits_token)
        first = 2
    else:
        first = 1
    backoff = Backoff(CONFLICT_BACKOFF_S, CONFLICT_BACKOFF_MAX_S, full_jitter=True)
    if first == 2:
        if on_retry is not None:
            on_retry()
        await asyncio.sleep(backoff.delay_s(0, rng))
    for attempt in range(first, attempts + 1):
        token = WRITE_ALONE.set(True) if attempt > alone_after else None
        commits = [0]
        commits_token = OP_COMMITS.set(commits)
        try:
            return await fn(*args, **kwargs)
        except TxnConflict:
            if attempt == attempts or commits[0]:
                raise
            if on_retry is not None:
                on_retry()
            await asyncio.sleep(backoff.delay_s(attempt - 1, rng))
        finally:
            OP_COMMITS.reset(commits_token)
            if token is not None:
                WRITE_ALONE.reset(token)
    raise AssertionError("unreachable")  # pragma: no cover


class ConflictRetrying:
    """The namespace as the services see it: every coroutine method re-runs on ``TxnConflict``
    (``retry_conflicts``); everything else passes through. ``retries``: re-runs so far."""

    def __init__(self, ns: Namespace, attempts: int = CONFLICT_ATTEMPTS):
        self._ns = ns
        self._attempts = attempts
        self._wrapped: dict[str, Callable[..., Any]] = {}
        self.retries = 0

    def _count(self) -> None:
        self.retries += 1

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._ns, name)
        if not inspect.iscoroutinefunction(attr):
            return attr
        wrapped = self._wrapped.get(name)
        if wrapped is None:
            @functools.wraps(attr)
            async def call(*args: Any, **kwargs: Any) -> Any:
                return await retry_conflicts(getattr(self._ns, name), *args, attempts=self._attempts,
                                             on_retry=self._count, **kwargs)

            wrapped = self._wrapped[name] = call
            self.__dict__[name] = wrapped  # found directly from now on (no __getattr__, no inspect)
        return wrapped

    def __repr__(self) -> str:
        return f"ConflictRetrying({self._ns!r} retries={self.retries})"


def conflict_retrying(ns: Namespace) -> Namespace:
    """The namespace the services call: ``ConflictRetrying(ns)`` on an engine whose writes may
    lose a conflict (PostgreSQL), ``ns`` itself otherwise (SQLite: nothing to re-run, and a
    wrapper and a context variable less per request)."""
    if ns.store.conflicts_possible:
        return cast(Namespace, ConflictRetrying(ns))
    return ns


def grant_key() -> bytes | None:
    """The key write grants are signed with; None when the cluster runs without a secret
    (or without ``loomfs.net.auth``, which lands with authentication)."""
    global _key_of
    if _key_of is None:
        try:
            from loomfs.net import auth
            _key_of = getattr(auth, "process_grant_key", lambda: None)
        except ImportError:
            _key_of = lambda: None  # noqa: E731
    return _key_of()


_key_of: Callable[[], bytes | None] | None = None


def write_grant(inode: int, ctx: CallContext) -> bytes:
    """A write grant for the caller's token on ``inode`` (b"" without a cluster secret)."""
    key = grant_key()
    if key is None:
        return b""
    return grants.mint(key, inode, ctx.identity.token_id, time.time() + grants.DEFAULT_GRANT_TTL_S)


def act_for(ctx: CallContext, root_squash: bool) -> None:
    """The namespace acts for the connection's identity for the rest of this request (its own
    task); nothing to do for TRUSTED (auth off), the default."""
    if ctx.identity is not TRUSTED or root_squash:
        set_caller(ctx.identity, root_squash=root_squash)


class MetaService(LockHandlers):
    """``root_squash``: uid 0 from a credential without ADMIN acts as nobody
    (``loomfs.meta.perm.effective``). The lock calls come from ``LockHandlers``."""

    def __init__(self, ns: Namespace, *, root_squash: bool = False):
        self.ns = ns
        self.root_squash = root_squash

    @handles(w.STAT)
    async def stat(self, req: w.PathReq, ctx: CallContext) -> w.AttrRsp:
        act_for(ctx, self.root_squash)
        return w.AttrRsp(attr=await self.ns.stat(req.path, follow_symlinks=req.follow_symlinks))

    @handles(w.MKDIR)
    async def mkdir(self, req: w.MkdirReq, ctx: CallContext) -> w.AttrRsp:
        act_for(ctx, self.root_squash)
        attr = await self.ns.mkdir(
            req.path, mode=req.mode, parents=req.parents, exist_ok=req.exist_ok, uid=req.uid, gid=req.gid
        )
        return w.AttrRsp(attr=attr)

    @handles(w.OPEN)
    async def open(self, req: w.OpenReq, ctx: CallContext) -> w.OpenRsp:
        act_for(ctx, self.root_squash)
        o = await self.ns.open(
            req.path, req.flags, mode=req.mode, uid=req.uid, gid=req.gid, client_id=req.client_id,
            session_id=req.session_id, data=req.data, data_crc=req.data_crc if req.data is not None else None,
            chunked=req.chunked,
        )
        return w.OpenRsp(attr=o.attr, session_id=o.session_id, truncated_from=o.truncated_from,
                         session_lease_s=self.ns.session_lease_s if o.session_id or o.held else 0.0, replayed=o.replayed,
                         trunc_epoch=o.trunc_epoch, data=o.data,
                         data_crc=crc32c.crc32c(o.data) if o.data is not None else 0,
                         write_grant=write_grant(o.attr.inode, ctx) if o.session_id else b"",
                         read_grant=read_grant(o.attr, ctx)
                         if (req.flags & os.O_ACCMODE) != os.O_WRONLY and o.data is None else b"")

    @handles(w.READ)
    async def read(self, req: w.PathReq, ctx: CallContext) -> w.ReadRsp:
        act_for(ctx, self.root_squash)
        attr, data = await self.ns.read(req.path, follow_symlinks=req.follow_symlinks)
        return w.ReadRsp(attr=attr, data=data, data_crc=crc32c.crc32c(data) if data is not None else 0,
                         read_grant=read_grant(attr, ctx) if data is None else b"")

    @handles(w.WRITE_INLINE)
    async def write_inline(self, req: w.InlineWriteReq, ctx: CallContext) -> w.InlineWriteRsp:
        act_for(ctx, self.root_squash)
        crc = 0
        for p in req.patches:
            crc = crc32c.crc32c(p.data, crc)
        if crc != req.crc:
            raise StatusError(Status.CHECKSUM_MISMATCH, f"inode {req.inode}: inline writes fail their CRC32C")
        r = await self.ns.write_inline(req.inode, req.session_id, [Patch(p.offset, p.data) for p in req.patches],
                                       mtime_ns=req.mtime_ns, close=req.close)
        return w.InlineWriteRsp(attr=r.attr, applied=r.applied, trunc_epoch=r.trunc_epoch)

    @handles(w.MIGRATE)
    async def migrate(self, req: w.InodeReq, ctx: CallContext) -> w.AttrRsp:
        act_for(ctx, self.root_squash)
        attr, epoch = await self.ns.migrate(req.inode)
        return w.AttrRsp(attr=attr, trunc_epoch=epoch, write_grant=write_grant(attr.inode, ctx))

    @handles(w.CLOSE)
    async def close(self, req: w.CloseReq, ctx: CallContext) -> w.AttrRsp:
        act_for(ctx, self.root_squash)
        r = await self.ns.report(req.inode, req.session_id, req.length, req.mtime_ns,
                                 trunc_epoch=req.trunc_epoch, end=True)
        return w.AttrRsp(attr=r.attr, trunc_epoch=r.trunc_epoch)

    @handles(w.RENEW_SESSIONS)
    async def renew_sessions(self, req: w.RenewSessionsReq, ctx: CallContext) -> w.RenewSessionsRsp:
        act_for(ctx, self.root_squash)
        renewed = await self.ns.renew_sessions(req.client_id, req.session_ids)
        grants: list[bytes] = []
        if req.inodes and grant_key() is not None:
            if len(req.inodes) != len(req.session_ids):
                raise StatusError(Status.BAD_REQUEST, f"{len(req.inodes)} inodes for {len(req.session_ids)} sessions")
            held = await self.ns.sessions_held(req.client_id, list(zip(req.inodes, req.session_ids, strict=True)))
            grants = [write_grant(ino, ctx) if h else b"" for ino, h in zip(req.inodes, held, strict=True)]
        return w.RenewSessionsRsp(renewed=renewed, write_grants=grants)

    @handles(w.SYNC)
    async def sync(self, req: w.SyncReq, ctx: CallContext) -> w.AttrRsp:
        act_for(ctx, self.root_squash)
        r = await self.ns.report(req.inode, req.session_id, req.length, req.mtime_ns, trunc_epoch=req.trunc_epoch,
                                 ec_reduced=req.ec_reduced, ec_reduced_done=req.ec_reduced_done)
        return w.AttrRsp(attr=r.attr, trunc_epoch=r.trunc_epoch)

    @handles(w.READDIR)
    async def readdir(self, req: w.ReaddirReq, ctx: CallContext) -> w.ReaddirRsp:
        act_for(ctx, self.root_squash)
        entries, more, dir_inode = await self.ns.readdir_in(
            req.path, after=req.after, limit=req.limit, with_attrs=req.with_attrs, dir_inode=req.dir_inode
        )
        return w.ReaddirRsp(entries=entries, more=more, dir_inode=dir_inode)

    @handles(w.RENAME)
    async def rename(self, req: w.RenameReq, ctx: CallContext) -> Empty:
        act_for(ctx, self.root_squash)
        if req.exchange:
            if req.expect_inode:
                raise StatusError(Status.EINVAL, "a conditional replace (expect_inode) is not an exchange")
            await self.ns.exchange(req.src, req.dst)
        else:
            expect = (req.expect_inode, req.expect_size, req.expect_mtime_ns) if req.expect_inode else None
            await self.ns.rename(req.src, req.dst, no_replace=req.no_replace, expect=expect)
        return Empty()

    @handles(w.UNLINK)
    async def unlink(self, req: w.PathReq, ctx: CallContext) -> w.UnlinkRsp:
        act_for(ctx, self.root_squash)
        inode, queued = await self.ns.unlink(req.path)
        return w.UnlinkRsp(inode=inode, gc_queued=queued)

    @handles(w.RMDIR)
    async def rmdir(self, req: w.PathReq, ctx: CallContext) -> w.UnlinkRsp:
        act_for(ctx, self.root_squash)
        inode, queued = await self.ns.rmdir(req.path)
        return w.UnlinkRsp(inode=inode, gc_queued=queued)

    @handles(w.SYMLINK)
    async def symlink(self, req: w.SymlinkReq, ctx: CallContext) -> w.AttrRsp:
        act_for(ctx, self.root_squash)
        return w.AttrRsp(attr=await self.ns.symlink(req.target, req.path, uid=req.uid, gid=req.gid))

    @handles(w.MKNOD)
    async def mknod(self, req: w.MknodReq, ctx: CallContext) -> w.AttrRsp:
        act_for(ctx, self.root_squash)
        attr = await self.ns.mknod(req.path, type=req.type, mode=req.mode, rdev=req.rdev, uid=req.uid,
                                   gid=req.gid)
        return w.AttrRsp(attr=attr)

    @handles(w.READLINK)
    async def readlink(self, req: w.PathReq, ctx: CallContext) -> w.ReadlinkRsp:
        act_for(ctx, self.root_squash)
        return w.ReadlinkRsp(target=await self.ns.readlink(req.path))

    @handles(w.LINK)
    async def link(self, req: w.LinkReq, ctx: CallContext) -> w.AttrRsp:
        act_for(ctx, self.root_squash)
        attr = await self.ns.link(req.src, req.dst, follow_symlinks=req.follow_symlinks)
        return w.AttrRsp(attr=attr)

    @handles(w.SETATTR)
    async def setattr(self, req: w.SetattrReq, ctx: CallContext) -> w.SetattrRsp:
        act_for(ctx, self.root_squash)
        r = await self.ns.setattr(
            req.path, follow_symlinks=req.follow_symlinks, mode=req.mode, uid=req.uid, gid=req.gid,
            atime_ns=req.atime_ns, mtime_ns=req.mtime_ns, size=req.size, inode=req.inode,
            times_now=req.times_now,
        )
        return w.SetattrRsp(attr=r.attr, truncated_from=r.truncated_from, trunc_epoch=r.trunc_epoch)

    @handles(w.STATFS)
    async def statfs(self, req: Empty, ctx: CallContext) -> w.StatfsRsp:
        act_for(ctx, self.root_squash)
        s = await self.ns.statfs()
        return w.StatfsRsp(
            files=s.files, directories=s.directories, bytes_used=s.bytes_used, gc_pending=s.gc_pending,
            trims_pending=s.trims_pending,
        )

    @handles(w.GC_QUEUED)
    async def gc_queued(self, req: w.InodesReq, ctx: CallContext) -> w.InodesRsp:
        act_for(ctx, self.root_squash)
        if len(req.inodes) > w.GC_QUEUED_INODES_MAX:
            raise StatusError(Status.EINVAL, f"gc_queued: at most {w.GC_QUEUED_INODES_MAX} inodes per call")
        return w.InodesRsp(inodes=await self.ns.gc_queued(list(req.inodes)))

    @handles(w.INODES_LIVE)
    async def inodes_live(self, req: w.InodesReq, ctx: CallContext) -> w.InodesRsp:
        act_for(ctx, self.root_squash)
        if len(req.inodes) > w.GC_QUEUED_INODES_MAX:
            raise StatusError(Status.EINVAL, f"inodes_live: at most {w.GC_QUEUED_INODES_MAX} inodes per call")
        return w.InodesRsp(inodes=await self.ns.live_inodes(list(req.inodes)))

    @handles(w.SET_LAYOUT)
    async def set_layout(self, req: w.SetLayoutReq, ctx: CallContext) -> w.AttrRsp:
        act_for(ctx, self.root_squash)
        return w.AttrRsp(attr=await self.ns.set_layout(req.path, req.layout))

    @handles(w.TENANT_CREATE)
    async def tenant_create(self, req: w.TenantCreateReq, ctx: CallContext) -> w.TenantInfo:
        t = await self.ns.create_tenant(req.name, uid=req.uid, gid=req.gid, mode=req.mode)
        logger.info("req %d: tenant %r created (number %d, root inode %d, owner %d:%d) by %s", ctx.request_id,
                    t.name, t.number, t.root.inode if t.root else 0, req.uid, req.gid,
                    ctx.identity.token_id or ctx.identity.uid)
        return w.TenantInfo(name=t.name, number=t.number, root=t.root)

    @handles(w.TENANT_LIST)
    async def tenant_list(self, req: Empty, ctx: CallContext) -> w.TenantListRsp:
        return w.TenantListRsp(tenants=[w.TenantInfo(name=t.name, number=t.number, root=t.root)
                                        for t in await self.ns.list_tenants()])

    @handles(w.META_PING)
    async def ping(self, req: Empty, ctx: CallContext) -> Empty:
        return Empty()

    def __repr__(self) -> str:
        return f"MetaService({self.ns!r})"
