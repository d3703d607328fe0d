"""Read grants (``loomfs.common.grants``): meta's signed permission for one token to read one
inode's chunks at storage. Meta puts one into every reply that walked the path and checked r
(open for reading, READ, READ_MANY); the client sends it with every chunk READ of that inode
(``ReadReq.grant``). READ_GRANTS only *renews* grants: for each inode the caller shows a grant
meta minted for it earlier (expired or not, within ``PROOF_MAX_AGE_S``), and gets a fresh one
if it still has POSIX r on the inode. A bare inode number earns nothing, so a token cannot
read a file in a directory it cannot search by guessing the inode number.
"""

from __future__ import annotations

from loomfs.wire.message import Message, many, message, method
from loomfs.wire.types import SERVICE_META

READ_GRANTS_INODES_MAX = 1024  # per request
PROOF_MAX_AGE_S = 7 * 86400.0  # an old grant proves an earlier path walk for this long after it ran out


@message
class ReadGrantsReq(Message):
    inodes: list[int] = many()
    proofs: list[bytes] = many()  # parallel to inodes: a grant meta minted for this token and inode


@message
class ReadGrantsRsp(Message):
    # parallel to the request's inodes: b"" where the caller may not read the inode, the inode
    # does not exist (or is outside its tenant), or the cluster runs without a secret
    grants: list[bytes] = many()
    ttl_s: float = 0.0  # how long the grants last from now (the client asks again past half of it)


READ_GRANTS = method(SERVICE_META, 62, "read_grants", ReadGrantsReq, ReadGrantsRsp, idempotent=True)
