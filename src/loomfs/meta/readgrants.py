"""Read grants (``loomfs.common.grants``) from meta: in replies that walked the path, and renewed
by READ_GRANTS.

Storage checks tenants itself but cannot check POSIX permissions; a client that reads a
chunked file sends meta's read grant for its inode with every chunk READ
(``storage/grantcheck.py: ReadGrantCheck``). ``read_grant`` mints one for a reply that walked
the path and checked r (open for reading, READ, READ_MANY). READ_GRANTS renews: for each inode
the caller shows a grant meta minted for it and that inode earlier (its MAC checked, expired up
to ``PROOF_MAX_AGE_S`` ago), and gets a fresh one when it still has POSIX r on the inode (its
token's identity, root-squashed like every meta call), the inode is a regular file in its
tenant. Without a proof it gets one only for its own files (the KV cache reads its segment
files by inode) or as root (whose search permission never fails): another user's inode number
alone never earns a grant, so a token cannot read a file in a directory it cannot search by
guessing the number. Services and
admins need no grants (storage lets them through): they get empty ones. One store read per
request, one HMAC per proof and per granted inode.
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
from loomfs.wire.grants import (
    PROOF_MAX_AGE_S,
    READ_GRANTS,
    READ_GRANTS_INODES_MAX,
    ReadGrantsReq,
    ReadGrantsRsp,
)
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


def _proven(key: bytes, proof: bytes, inode: int, token_id: str, now_s: float) -> bool:
    """Whether ``proof`` is a read grant meta minted for ``token_id`` and ``inode``, expired at
    most ``PROOF_MAX_AGE_S`` ago (the caller reached the inode through a path walk then)."""
    expires_at_s = grants.expires_at_s(proof)
    if not proof or now_s - expires_at_s > PROOF_MAX_AGE_S:
        return False
    try:
        grants.verify(key, proof, inode, token_id, expires_at_s)  # the MAC, inode and token; not the expiry
    except grants.GrantError:
        return False
    return True


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
    async def read_grants(self, req: ReadGrantsReq, ctx: CallContext) -> ReadGrantsRsp:
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
        now_s = self.wall_clock()
        expires_at_s = now_s + self.ttl_s
        out: list[bytes] = []
        for i, inode in enumerate(req.inodes):
            proof = req.proofs[i] if i < len(req.proofs) else b""
            p = perms.get(inode)
            # reachable: proven by an earlier grant (a path walk), or the caller's own file, or
            # root (whose search permission never fails)
            reachable = p is not None and (who.uid == 0 or p[2] == who.uid
                                           or _proven(key, proof, inode, caller.token_id, now_s))
            if not reachable or p is None or p[0] != _FILE or tenancy.tenant_of(inode) != tenant \
                    or not allowed(_Perms(*p), who, R):
                self.denied_total += 1
                out.append(b"")
                continue
            self.minted_total += 1
            out.append(grants.mint(key, inode, caller.token_id, expires_at_s))
        return ReadGrantsRsp(grants=out, ttl_s=self.ttl_s)

    def __repr__(self) -> str:
        return f"ReadGrantService(minted={self.minted_total} denied={self.denied_total})"
