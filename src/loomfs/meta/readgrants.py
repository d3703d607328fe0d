"""READ_GRANTS: meta mints read grants (``loomfs.common.grants``) for the inodes a caller may read.

Storage checks tenants itself but cannot check POSIX permissions; a client that reads a
chunked file sends meta's read grant for its inode with every chunk READ
(``storage/grantcheck.py: ReadGrantCheck``). The client asks for grants by inode number when it
has none for a file it reads (or storage says its grant ran out), so every read path (open,
READ/READ_MANY, relaxed-mode attributes from the cache, EC, the mount) gets one the same way.

A grant is minted when the caller (its token's identity, root-squashed like every meta call)
has POSIX r on the inode itself, the inode is a regular file and it lies in the caller's
tenant (a tenant-less user: the shared namespace). Like an open file descriptor, the path's
search permissions are not walked again. Services and admins need no grants (storage lets
them through): they get empty ones. One store read per request, one HMAC per granted inode.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

from loomfs.common import grants
from loomfs.errors import InvalidArgument
from loomfs.meta import tenancy
from loomfs.meta.ops.namespace import Namespace
from loomfs.meta.perm import R, allowed, effective
from loomfs.net.rpc import CallContext, handles
from loomfs.wire.grants import READ_GRANTS, READ_GRANTS_INODES_MAX, ReadGrantsRsp
from loomfs.wire.meta import InodesReq
from loomfs.wire.types import FileType

_FILE = int(FileType.FILE)


class _Perms(NamedTuple):
    type: int
    mode: int
    uid: int
    gid: int


def _process_key() -> bytes | None:
    from loomfs.net.auth import process_read_grant_key

    return process_read_grant_key()


def read_grant(attr: object, ctx: CallContext) -> bytes:
    """A read grant for a reply that already checked the caller's r on ``attr``'s inode (an
    open for reading, READ, READ_MANY): the client then needs no READ_GRANTS round trip before
    its first chunk READ. b"" for inline files and non-files (nothing to read at storage), for
    services and admins (storage lets them through) and without a cluster secret."""
    caller = ctx.identity
    if caller.privileged or getattr(attr, "type", None) != _FILE or getattr(attr, "inline", False):
        return b""
    key = _process_key()
    if key is None:
        return b""
    return grants.mint(key, int(getattr(attr, "inode", 0)), caller.token_id, time.time() + grants.DEFAULT_GRANT_TTL_S)


class ReadGrantService:
    def __init__(self, ns: Namespace, *, root_squash: bool = False, ttl_s: float = grants.DEFAULT_GRANT_TTL_S,
                 key: Callable[[], bytes | None] = _process_key, wall_clock: Callable[[], float] = time.time):
        """``key``: the read-grant key (the process's, from its cluster secret; None: no secret)."""
        self.ns = ns
        self.root_squash = root_squash
        self.ttl_s = ttl_s
        self.key = key
        self.wall_clock = wall_clock
        self.minted_total = 0
        self.denied_total = 0

    @handles(READ_GRANTS)
    async def read_grants(self, req: InodesReq, ctx: CallContext) -> ReadGrantsRsp:
        n = len(req.inodes)
        if n > READ_GRANTS_INODES_MAX:
            raise InvalidArgument(f"{n} inodes in one READ_GRANTS (at most {READ_GRANTS_INODES_MAX})")
        key = self.key()
        caller = ctx.identity
        if key is None or caller.privileged:
            return ReadGrantsRsp(grants=[b""] * n)
        who = effective(caller, root_squash=self.root_squash)
        async with self.ns.store.read() as txn:
            perms = await txn.get_perms(req.inodes)
            tenant = await tenancy.tenant_number(txn, who.tenant)  # EACCES for a tenant nobody made
        expires_at_s = self.wall_clock() + self.ttl_s
        out: list[bytes] = []
        for inode in req.inodes:
            p = perms.get(inode)
            if p is None or p[0] != _FILE or tenancy.tenant_of(inode) != tenant or not allowed(_Perms(*p), who, R):
                self.denied_total += 1
                out.append(b"")
                continue
            self.minted_total += 1
            out.append(grants.mint(key, inode, caller.token_id, expires_at_s))
        return ReadGrantsRsp(grants=out, ttl_s=self.ttl_s)

    def __repr__(self) -> str:
        return f"ReadGrantService(minted={self.minted_total} denied={self.denied_total})"
