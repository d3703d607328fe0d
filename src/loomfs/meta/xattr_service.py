"""RPC adapter for extended attributes (``loomfs.wire.meta_xattr``): decode, ops, encode.

A service object on the meta RPC server next to ``MetaService``; the rules are in
``loomfs.meta.ops.xattrs``. Each call acts for the connection's identity
(``loomfs.meta.caller``), never for anything a request body says.
"""

from __future__ import annotations

import logging

from loomfs.meta.ops.namespace import Namespace
from loomfs.meta.service import act_for
from loomfs.net.rpc import CallContext, handles
from loomfs.wire import meta_xattr as wx

logger = logging.getLogger(__name__)


class XattrService:
    def __init__(self, ns: Namespace, *, root_squash: bool = False):
        self.ns = ns
        self.root_squash = root_squash

    def _act_for(self, ctx: CallContext) -> None:
        act_for(ctx, self.root_squash)

    @handles(wx.GETXATTR)
    async def getxattr(self, req: wx.XattrNameReq, ctx: CallContext) -> wx.XattrValueRsp:
        self._act_for(ctx)
        value = await self.ns.getxattr(req.path, req.name, follow_symlinks=req.follow_symlinks, inode=req.inode)
        return wx.XattrValueRsp(value=value)

    @handles(wx.LISTXATTR)
    async def listxattr(self, req: wx.XattrListReq, ctx: CallContext) -> wx.XattrListRsp:
        self._act_for(ctx)
        return wx.XattrListRsp(names=await self.ns.listxattr(req.path, follow_symlinks=req.follow_symlinks,
                                                             inode=req.inode))

    @handles(wx.SETXATTR)
    async def setxattr(self, req: wx.XattrSetReq, ctx: CallContext) -> wx.XattrAttrRsp:
        self._act_for(ctx)
        attr = await self.ns.setxattr(req.path, req.name, req.value, flags=req.flags,
                                      follow_symlinks=req.follow_symlinks, inode=req.inode)
        logger.debug("req %d: setxattr %s %r (%d bytes)", ctx.request_id, req.path, req.name[:64], len(req.value))
        return wx.XattrAttrRsp(attr=attr)

    @handles(wx.REMOVEXATTR)
    async def removexattr(self, req: wx.XattrNameReq, ctx: CallContext) -> wx.XattrAttrRsp:
        self._act_for(ctx)
        attr = await self.ns.removexattr(req.path, req.name, follow_symlinks=req.follow_symlinks,
                                         inode=req.inode)
        return wx.XattrAttrRsp(attr=attr)

    def __repr__(self) -> str:
        return f"XattrService(root_squash={self.root_squash})"
