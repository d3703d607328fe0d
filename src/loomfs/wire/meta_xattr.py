"""meta service extended-attribute calls (methods 50-53): ``user.*`` attributes by path, or by
inode (``inode`` non-zero: a file whose last name went but is still open somewhere, or the
inode a mount's kernel means whatever its names are now).

Names and values are bytes (a name need not be UTF-8); the rules and limits are meta's
(``loomfs.meta.ops.xattrs``): a name of 1..255 bytes in the ``user.`` namespace, a value of at
most 64 KiB, so a request body stays far below the frame's header bound. Errors come back as
the errno statuses the syscalls give (ENODATA, EEXIST, ERANGE, E2BIG, ENOTSUP, EPERM, EACCES).
"""

from __future__ import annotations

from loomfs.common.identity import Right
from loomfs.wire.message import Message, many, message, method
from loomfs.wire.types import SERVICE_META, Attr


@message
class XattrNameReq(Message):
    """GETXATTR, REMOVEXATTR."""

    path: str = ""
    name: bytes = b""
    follow_symlinks: bool = True
    inode: int = 0  # non-zero: this inode (``path`` only labels errors)


@message
class XattrValueRsp(Message):
    value: bytes = b""


@message
class XattrListReq(Message):
    path: str = ""
    follow_symlinks: bool = True
    inode: int = 0


@message
class XattrListRsp(Message):
    names: list[bytes] = many()  # byte order


@message
class XattrSetReq(Message):
    path: str = ""
    name: bytes = b""
    value: bytes = b""
    flags: int = 0  # os.XATTR_CREATE (EEXIST if set) | os.XATTR_REPLACE (ENODATA if not)
    follow_symlinks: bool = True
    inode: int = 0


@message
class XattrAttrRsp(Message):
    """SETXATTR, REMOVEXATTR: the inode's attributes after the change (its new ctime)."""

    attr: Attr | None = None


GETXATTR = method(SERVICE_META, 50, "getxattr", XattrNameReq, XattrValueRsp, idempotent=True, needs=Right.READ)
LISTXATTR = method(SERVICE_META, 51, "listxattr", XattrListReq, XattrListRsp, idempotent=True, needs=Right.READ)
# not idempotent: a re-sent XATTR_CREATE would answer EEXIST for its own first attempt
SETXATTR = method(SERVICE_META, 52, "setxattr", XattrSetReq, XattrAttrRsp, needs=Right.WRITE)
REMOVEXATTR = method(SERVICE_META, 53, "removexattr", XattrNameReq, XattrAttrRsp, needs=Right.WRITE)
