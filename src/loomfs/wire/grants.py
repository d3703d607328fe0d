"""Read grants (``loomfs.common.grants``): meta's signed permission for one token to read one
inode's chunks at storage. A client asks for them by inode (READ_GRANTS) when it has none for
a file it reads, or when storage says its grant ran out; it then sends the grant with every
chunk READ of that inode (``ReadReq.grant``). Meta mints one per inode the caller may read
(POSIX r on the inode itself, like an open file descriptor; confined to its tenant).
"""

from __future__ import annotations

from loomfs.wire.message import Message, many, message, method
from loomfs.wire.meta import InodesReq
from loomfs.wire.types import SERVICE_META

READ_GRANTS_INODES_MAX = 1024  # per request


@message
class ReadGrantsRsp(Message):
    # parallel to the request's inodes: b"" where the caller may not read the inode, the inode
    # does not exist (or is outside its tenant), or the cluster runs without a secret
    grants: list[bytes] = many()
    ttl_s: float = 0.0  # how long the grants last from now (the client asks again past half of it)


READ_GRANTS = method(SERVICE_META, 62, "read_grants", InodesReq, ReadGrantsRsp, idempotent=True)
