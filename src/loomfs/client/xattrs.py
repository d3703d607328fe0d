"""Extended attributes on the async core, by path (shaped like ``os.getxattr`` & co.) or by
inode (``*_inode``: a file open here whose last name went; the mount's calls).

Names may be ``str`` (encoded with ``os.fsencode``) or ``bytes``; values are bytes. Only the
``user.*`` namespace is stored (``loomfs.meta.ops.xattrs`` has the rules); the limits are
checked here too so a bad call fails without a round trip: a name of 1..255 bytes (ERANGE),
a value of at most 64 KiB (E2BIG). A change moves the file's ctime: the client's cached
attributes of the path are dropped.
"""

from __future__ import annotations

import errno
import os
from typing import TYPE_CHECKING

from loomfs.client import paths
from loomfs.errors import error_for_errno
from loomfs.wire import meta_xattr as wx
from loomfs.wire.types import Attr

if TYPE_CHECKING:
    from loomfs.client.core import AsyncClient

XATTR_NAME_MAX_BYTES = 255
XATTR_VALUE_MAX_BYTES = 64 << 10

NameLike = str | bytes


def encode_name(name: NameLike, path: str) -> bytes:
    raw = os.fsencode(name)
    if not raw or len(raw) > XATTR_NAME_MAX_BYTES:
        raise error_for_errno(errno.ERANGE, f"xattr name of {len(raw)} bytes (1..{XATTR_NAME_MAX_BYTES})", path)
    return raw


async def _path(client: AsyncClient, path: str) -> str:
    """``path`` normalised, with this client's pending "w" create of it made first."""
    p = paths.normalize(path)
    if client.lazy:
        await client.lazy.settle(p)
    return p


async def getxattr(client: AsyncClient, path: str, name: NameLike, *, follow_symlinks: bool = True) -> bytes:
    p = await _path(client, path)
    return await client.meta.getxattr(p, encode_name(name, p), follow_symlinks)


async def listxattr(client: AsyncClient, path: str, *, follow_symlinks: bool = True) -> list[str]:
    """The names, decoded with ``os.fsdecode`` as ``os.listxattr`` does."""
    p = await _path(client, path)
    return [os.fsdecode(n) for n in await client.meta.listxattr(p, follow_symlinks)]


async def setxattr(client: AsyncClient, path: str, name: NameLike, value: bytes, flags: int = 0, *,
                   follow_symlinks: bool = True) -> Attr | None:
    """``flags``: ``os.XATTR_CREATE`` (EEXIST if set), ``os.XATTR_REPLACE`` (ENODATA if not)."""
    p = await _path(client, path)
    raw = encode_name(name, p)
    value = bytes(value)
    if len(value) > XATTR_VALUE_MAX_BYTES:
        raise error_for_errno(errno.E2BIG, f"xattr value of {len(value)} bytes (max {XATTR_VALUE_MAX_BYTES})", p)
    try:
        return await client.meta.setxattr(p, raw, value, flags, follow_symlinks)
    finally:
        client.caches.changed(p)


async def removexattr(client: AsyncClient, path: str, name: NameLike, *, follow_symlinks: bool = True) -> Attr | None:
    p = await _path(client, path)
    raw = encode_name(name, p)
    try:
        return await client.meta.removexattr(p, raw, follow_symlinks)
    finally:
        client.caches.changed(p)


# --- by inode: an open file whose last name went, or the inode a mount's kernel means -------
# (``path``, when known, only labels errors and has its cached attributes dropped on a change)


async def getxattr_inode(client: AsyncClient, inode: int, name: NameLike, *, path: str = "") -> bytes:
    rsp: wx.XattrValueRsp = await client.meta.call(
        wx.GETXATTR, wx.XattrNameReq(path=path, name=encode_name(name, path), follow_symlinks=False, inode=inode))
    return rsp.value


async def listxattr_inode(client: AsyncClient, inode: int, *, path: str = "") -> list[bytes]:
    """The raw names (bytes), byte order."""
    rsp: wx.XattrListRsp = await client.meta.call(
        wx.LISTXATTR, wx.XattrListReq(path=path, follow_symlinks=False, inode=inode))
    return list(rsp.names)


async def setxattr_inode(client: AsyncClient, inode: int, name: NameLike, value: bytes, flags: int = 0, *,
                         path: str = "") -> Attr | None:
    raw = encode_name(name, path)
    value = bytes(value)
    if len(value) > XATTR_VALUE_MAX_BYTES:
        raise error_for_errno(errno.E2BIG, f"xattr value of {len(value)} bytes (max {XATTR_VALUE_MAX_BYTES})", path)
    try:
        rsp: wx.XattrAttrRsp = await client.meta.call(
            wx.SETXATTR, wx.XattrSetReq(path=path, name=raw, value=value, flags=flags, follow_symlinks=False,
                                        inode=inode))
        return rsp.attr
    finally:
        if path:
            client.caches.changed(paths.normalize(path))


async def removexattr_inode(client: AsyncClient, inode: int, name: NameLike, *, path: str = "") -> Attr | None:
    try:
        rsp: wx.XattrAttrRsp = await client.meta.call(
            wx.REMOVEXATTR, wx.XattrNameReq(path=path, name=encode_name(name, path), follow_symlinks=False,
                                            inode=inode))
        return rsp.attr
    finally:
        if path:
            client.caches.changed(paths.normalize(path))
