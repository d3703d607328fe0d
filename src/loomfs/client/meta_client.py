"""Namespace calls to the (stateless) meta servers, with failover between them.

Meta servers are the ALIVE ``NodeKind.META`` nodes in routing. The client sticks to one
(chosen at random, so clients spread) and moves to another when it cannot be reached or
is shutting down (with several servers, a refused connect fails over at once instead of
waiting for the dead one to come back). ``RpcClient`` retries idempotent methods on transient
errors.
A non-idempotent call whose connection broke mid-flight is re-sent to the next server,
like NFS: it may then report EEXIST/ENOENT for work the first attempt did. OPEN is the
exception: write opens carry a session id the client chose, and meta answers a re-sent
one from the session the first attempt made (no second session, no spurious EEXIST).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from typing import Any

import crc32c

from loomfs.common.retry import Backoff
from loomfs.common.routing import RoutingClient
from loomfs.errors import ConnectionFailed, LoomError, TimedOut
from loomfs.net.rpc import Response, RpcClient
from loomfs.net.transport import Address
from loomfs.wire import meta as wm
from loomfs.wire import meta_xattr as wx
from loomfs.wire.message import Empty, Message, Method
from loomfs.wire.status import Status
from loomfs.wire.types import Attr, Layout, NodeKind

logger = logging.getLogger(__name__)

RESEND_ROUNDS = 4  # rounds over the meta servers for a request meta dedupes
RESEND_BACKOFF = Backoff(0.1, 2.0)  # before the third round, doubling


class MetaClient:
    """Typed wrappers around the meta RPCs; everything goes through ``call``."""

    def __init__(self, rpc: RpcClient | None, routing: RoutingClient | None, *, rng: random.Random | None = None):
        self.rpc = rpc
        self.routing = routing
        self._rng = rng or random.Random()
        self._preferred: Address | None = None
        self._last_used: Address | None = None  # kept when a failure drops _preferred
        self.failovers = 0

    async def _servers(self, refresh: bool) -> list[Address]:
        assert self.routing is not None
        routing = await (self.routing.refresh() if refresh else self.routing.get())
        nodes = routing.alive_nodes(NodeKind.META)
        addrs = [Address(n.host, n.port) for n in nodes]
        self._rng.shuffle(addrs)
        if self._preferred in addrs:
            addrs.remove(self._preferred)
            addrs.insert(0, self._preferred)
        return addrs

    async def call(self, m: Method, req: Message, *, resend_safe: bool = False) -> Any:
        """Send ``req`` to a meta server; returns the decoded reply body (``call_full``)."""
        return (await self.call_full(m, req, resend_safe=resend_safe)).body

    async def call_full(
        self, m: Method, req: Message, *, resend_safe: bool = False, payload: bytes | None = None,
    ) -> Response[Any]:
        """Send ``req`` (with a request ``payload``) to a meta server; returns the whole reply.

        ``resend_safe``: meta applies a re-send of this request once (an OPEN naming its
        session), so a call whose connection broke is re-sent through up to
        ``RESEND_ROUNDS`` rounds over the servers, not two. A meta killed mid-call often
        breaks the first re-send too: the kernel still completes a connect to the dying
        process's listening socket, then resets it."""
        assert self.rpc is not None
        last: BaseException | None = None
        rounds = RESEND_ROUNDS if resend_safe else 2
        for round_ in range(rounds):
            if round_ > 1:
                await asyncio.sleep(RESEND_BACKOFF.delay_s(round_ - 2))
            servers = await self._servers(round_ > 0)
            # one server: wait for it while it restarts (the RPC layer retries a refused connect
            # until the deadline); several: a refused connect moves on to the next at once
            patience = None if len(servers) == 1 else m.idempotent
            for addr in servers:
                try:
                    rsp = await self.rpc.call(addr, m, req, payload=payload, retry=patience)
                except (ConnectionFailed, TimedOut) as exc:
                    if isinstance(exc, TimedOut) and not m.idempotent:
                        raise
                    last = exc
                except LoomError as exc:
                    if exc.status is not Status.SHUTTING_DOWN:
                        raise
                    last = exc
                else:
                    if addr != self._preferred:
                        if self._last_used is not None and addr != self._last_used:
                            self.failovers += 1
                            logger.info("meta: now using %s", addr)
                        self._preferred = self._last_used = addr
                    return rsp
                logger.debug("meta %s failed for %s: %s", addr, m.name, last)
                if addr == self._preferred:
                    self._preferred = None
        if last is None:
            raise ConnectionFailed("no meta server is alive in routing")
        raise last

    # --- typed wrappers -------------------------------------------------------------

    async def stat(self, path: str, follow_symlinks: bool = True) -> Attr:
        rsp: wm.AttrRsp = await self.call(wm.STAT, wm.PathReq(path=path, follow_symlinks=follow_symlinks))
        assert rsp.attr is not None
        return rsp.attr

    async def mkdir(self, path: str, mode: int, parents: bool, exist_ok: bool) -> Attr:
        req = wm.MkdirReq(path=path, mode=mode, parents=parents, exist_ok=exist_ok)
        rsp: wm.AttrRsp = await self.call(wm.MKDIR, req)
        assert rsp.attr is not None
        return rsp.attr

    async def open(
        self, path: str, flags: int, mode: int, client_id: int, session_id: int = 0, *,
        data: bytes | None = None, chunked: bool = False,
    ) -> wm.OpenRsp:
        """``session_id``: the write session's id, chosen by the caller so that the re-send of
        an OPEN whose reply was lost is applied once (see ``call``). ``data``: a put (the
        whole content of a small file, stored inline when it fits); ``chunked``: create the
        file in chunks (a big file)."""
        req = wm.OpenReq(path=path, flags=flags, mode=mode, client_id=client_id, session_id=session_id,
                         data=data, data_crc=crc32c.crc32c(data) if data is not None else 0, chunked=chunked)
        changes = flags & (os.O_CREAT | os.O_TRUNC | os.O_WRONLY | os.O_RDWR)
        rsp: wm.OpenRsp = await self.call(wm.OPEN, req, resend_safe=bool(session_id) or not changes)
        return rsp

    async def close(
        self, inode: int, session_id: int, length: int, mtime_ns: int = 0, *, trunc_epoch: int = 0
    ) -> Attr | None:
        """End a write session with its length report; ``trunc_epoch``: the file's truncate
        epoch as the writer knows it (a stale one does not grow the length)."""
        req = wm.CloseReq(inode=inode, session_id=session_id, length=length, mtime_ns=mtime_ns,
                          trunc_epoch=trunc_epoch)
        rsp: wm.AttrRsp = await self.call(wm.CLOSE, req)
        return rsp.attr

    async def read(self, path: str, follow_symlinks: bool = True) -> wm.ReadRsp:
        """A file's attributes and, when inline, its bytes (CRC not checked here)."""
        rsp: wm.ReadRsp = await self.call(wm.READ, wm.PathReq(path=path, follow_symlinks=follow_symlinks))
        return rsp

    async def write_inline(
        self, inode: int, session_id: int, patches: list[wm.InlinePatch], crc: int, *, close: bool = False,
    ) -> wm.InlineWriteRsp:
        req = wm.InlineWriteReq(inode=inode, session_id=session_id, patches=patches, crc=crc, close=close)
        rsp: wm.InlineWriteRsp = await self.call(wm.WRITE_INLINE, req)
        return rsp

    async def migrate(self, inode: int) -> wm.AttrRsp:
        """Move an inline file to chunks; the reply has its attributes and truncate epoch."""
        rsp: wm.AttrRsp = await self.call(wm.MIGRATE, wm.InodeReq(inode=inode))
        return rsp

    async def renew_sessions(self, client_id: int, session_ids: list[int]) -> int:
        """Renew the write sessions this client holds; returns how many meta still had."""
        renewed = 0
        for i in range(0, len(session_ids), wm.RENEW_SESSIONS_MAX):
            req = wm.RenewSessionsReq(client_id=client_id, session_ids=session_ids[i : i + wm.RENEW_SESSIONS_MAX])
            rsp: wm.RenewSessionsRsp = await self.call(wm.RENEW_SESSIONS, req)
            renewed += rsp.renewed
        return renewed

    async def sync(self, inode: int, length: int, mtime_ns: int = 0, *, trunc_epoch: int = 0,
                   session_id: int = 0, ec_reduced: bool = False, ec_reduced_done: int = 0) -> wm.AttrRsp:
        """An open writer's length report (as ``close``); the reply has the current epoch.
        ``session_id``: the writer's session (meta tells a live one from an expired one).
        ``ec_reduced`` / ``ec_reduced_done``: see ``SyncReq``."""
        req = wm.SyncReq(inode=inode, length=length, mtime_ns=mtime_ns, trunc_epoch=trunc_epoch,
                         session_id=session_id, ec_reduced=ec_reduced, ec_reduced_done=ec_reduced_done)
        rsp: wm.AttrRsp = await self.call(wm.SYNC, req)
        return rsp

    async def readdir(self, path: str, after: str, limit: int, with_attrs: bool,
                      dir_inode: int = 0) -> wm.ReaddirRsp:
        req = wm.ReaddirReq(path=path, after=after, limit=limit, with_attrs=with_attrs, dir_inode=dir_inode)
        rsp: wm.ReaddirRsp = await self.call(wm.READDIR, req)
        return rsp

    async def rename(self, src: str, dst: str, no_replace: bool = False,
                     expect: tuple[int, int, int] | None = None) -> None:
        inode, size, mtime_ns = expect or (0, 0, 0)
        await self.call(wm.RENAME, wm.RenameReq(src=src, dst=dst, no_replace=no_replace, expect_inode=inode,
                                                expect_size=size, expect_mtime_ns=mtime_ns))

    async def unlink(self, path: str) -> wm.UnlinkRsp:
        rsp: wm.UnlinkRsp = await self.call(wm.UNLINK, wm.PathReq(path=path, follow_symlinks=False))
        return rsp

    async def rmdir(self, path: str) -> wm.UnlinkRsp:
        rsp: wm.UnlinkRsp = await self.call(wm.RMDIR, wm.PathReq(path=path, follow_symlinks=False))
        return rsp

    async def symlink(self, target: str, path: str) -> Attr | None:
        rsp: wm.AttrRsp = await self.call(wm.SYMLINK, wm.SymlinkReq(target=target, path=path))
        return rsp.attr

    async def readlink(self, path: str) -> str:
        rsp: wm.ReadlinkRsp = await self.call(wm.READLINK, wm.PathReq(path=path, follow_symlinks=False))
        return rsp.target

    async def link(self, src: str, dst: str) -> Attr | None:
        rsp: wm.AttrRsp = await self.call(wm.LINK, wm.LinkReq(src=src, dst=dst))
        return rsp.attr

    async def setattr(self, req: wm.SetattrReq) -> wm.SetattrRsp:
        rsp: wm.SetattrRsp = await self.call(wm.SETATTR, req)
        return rsp

    async def statfs(self) -> wm.StatfsRsp:
        rsp: wm.StatfsRsp = await self.call(wm.STATFS, Empty())
        return rsp

    async def set_layout(self, path: str, layout: Layout) -> Attr | None:
        rsp: wm.AttrRsp = await self.call(wm.SET_LAYOUT, wm.SetLayoutReq(path=path, layout=layout))
        return rsp.attr

    # extended attributes (``user.*``; ``loomfs.client.xattrs`` is the path-normalising API)

    async def getxattr(self, path: str, name: bytes, follow_symlinks: bool = True) -> bytes:
        req = wx.XattrNameReq(path=path, name=name, follow_symlinks=follow_symlinks)
        rsp: wx.XattrValueRsp = await self.call(wx.GETXATTR, req)
        return rsp.value

    async def listxattr(self, path: str, follow_symlinks: bool = True) -> list[bytes]:
        rsp: wx.XattrListRsp = await self.call(wx.LISTXATTR, wx.XattrListReq(path=path, follow_symlinks=follow_symlinks))
        return rsp.names

    async def setxattr(self, path: str, name: bytes, value: bytes, flags: int = 0,
                       follow_symlinks: bool = True) -> Attr | None:
        req = wx.XattrSetReq(path=path, name=name, value=value, flags=flags, follow_symlinks=follow_symlinks)
        rsp: wx.XattrAttrRsp = await self.call(wx.SETXATTR, req)
        return rsp.attr

    async def removexattr(self, path: str, name: bytes, follow_symlinks: bool = True) -> Attr | None:
        req = wx.XattrNameReq(path=path, name=name, follow_symlinks=follow_symlinks)
        rsp: wx.XattrAttrRsp = await self.call(wx.REMOVEXATTR, req)
        return rsp.attr

    def __repr__(self) -> str:
        return f"MetaClient(preferred={self._preferred} failovers={self.failovers})"
