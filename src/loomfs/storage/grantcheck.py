"""Storage's checks of meta's grants (``loomfs.common.grants``): chunk changes from clients need
a write grant (``GrantCheck``), chunk reads a read grant (``ReadGrantCheck``, below).

Services (chain peers forwarding, meta's GC and trimmer, resync) hold ``Right.SERVICE`` and pass,
and so do admin tokens (client-side repairs such as ``layout scrub --repair`` write fragments of
files nobody opened; an admin can drain and re-table the cluster anyway). A client's write, truncate or removal must carry a grant meta issued for that inode to that
client's token; a grant that is present is always checked, a missing one is refused once
``required`` (``StorageConfig.write_grants_required``). Without a cluster secret there is no key
and nothing is checked (every caller is TRUSTED then anyway).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable

from loomfs.common import grants
from loomfs.common.identity import Identity, Right
from loomfs.errors import StatusError
from loomfs.wire.status import Status
from loomfs.wire.storage import RequestTag

logger = logging.getLogger(__name__)


class GrantCheck:
    def __init__(self, key: bytes | None = None, *, required: bool = False,
                 wall_clock: Callable[[], float] = time.time):
        self.key = key
        self.required = required
        self.wall_clock = wall_clock
        self.refused_total = 0

    def check(self, identity: Identity, grant: bytes, inodes: list[int]) -> None:
        """Raise EACCES (AUTH_EXPIRED for an expired grant) unless ``identity`` may change ``inodes``."""
        if self.key is None or identity.can(Right.SERVICE) or identity.can(Right.ADMIN):
            return  # services, and admins repairing chunks (``layout scrub --repair``, fsck)
        if not grant and not self.required:
            return
        try:
            if len(inodes) != 1:
                raise grants.GrantError(f"a grant covers one inode, not {len(inodes)}")
            grants.verify(self.key, grant, inodes[0], identity.token_id, self.wall_clock())
        except grants.GrantError as exc:
            self.refused_total += 1
            n = self.refused_total
            if n <= 16 or n & (n - 1) == 0:
                logger.warning("refused a chunk change of inode %s by token %s: %s (%d refused so far)",
                               inodes[:4], identity.token_id, exc.reason, n)
            raise StatusError(Status.AUTH_EXPIRED if exc.expired else Status.EACCES, exc.reason) from None

    def __repr__(self) -> str:
        return f"GrantCheck(on={self.key is not None} required={self.required} refused={self.refused_total})"


def dedupe_slot(tag: RequestTag | None, kind: str, inode: int, index: int = 0) -> RequestTag | None:
    """The key the head's in-flight dedupe cache (``storage.dedupe.TagCache``) keeps a client
    request under: its tag bound to the request's kind and chunk (a hash of them, 63 bits).

    The cache answers a request whose (client id, request id) it has seen with that request's
    reply, without applying it. Keyed by the tag alone, a client that learnt another client's id
    could run a write, truncate or removal of *its own* chunk under that client's next request
    ids, and the victim's later request with such an id was answered with the attacker's reply
    and silently never applied (security hunt 16). A retry of a request names the same chunk,
    so binding the key to it changes nothing for retries; to take another request's slot a
    caller must now name the same chunk, which needs the write grant for it anyway."""
    if tag is None or (tag.client_id == 0 and tag.request_id == 0):
        return tag
    h = hashlib.blake2b(f"{kind}:{inode}:{index}:{tag.client_id}".encode(), digest_size=8).digest()
    return RequestTag(client_id=(int.from_bytes(h, "little") >> 1) | 1, request_id=tag.request_id)


CACHE_MAX = 1 << 17  # (token, inode) pairs a node remembers as granted; past it the table restarts


class ReadGrantCheck:
    """Storage's check of read grants (POSIX read permission, decided by meta) on chunk READs.

    A grant is verified once (an HMAC, ~2 us) and then remembered per (token id, inode) until it
    expires, so later reads of that inode by that token cost a dict look-up (~0.1 us) whether or
    not they carry the grant again. A grant that is present and not yet remembered is always
    verified (a bad one refused); a read without one is refused only once ``required``
    (``StorageConfig.read_grants_required``). Services and admin tokens pass (callers skip this
    for ``Identity.privileged``); without a cluster secret nothing is checked.
    """

    def __init__(self, key: bytes | None = None, *, required: bool = False,
                 wall_clock: Callable[[], float] = time.time):
        self.key = key
        self.required = required
        self.wall_clock = wall_clock
        self.granted: dict[tuple[str, int], float] = {}  # (token id, inode) -> grant expiry (unix s)
        self.refused_total = 0
        self.verified_total = 0
        self.missing_total = 0  # reads without a grant let through (not required yet)

    def check(self, identity: Identity, grant: bytes, inode: int) -> None:
        """Raise EACCES (AUTH_EXPIRED for an expired grant) unless ``identity`` may read ``inode``."""
        if self.key is None:
            return
        now_s = self.wall_clock()
        until = self.granted.get((identity.token_id, inode))
        if until is not None and now_s <= until:
            return
        if not grant:
            if self.required:
                self._refuse(identity, inode, "no read grant (open the file through meta, or ask READ_GRANTS)",
                             expired=until is not None)
            self.missing_total += 1
            return
        try:
            grants.verify(self.key, grant, inode, identity.token_id, now_s)
        except grants.GrantError as exc:
            self._refuse(identity, inode, exc.reason, expired=exc.expired)
        self.verified_total += 1
        if len(self.granted) >= CACHE_MAX:
            self.granted.clear()
        self.granted[(identity.token_id, inode)] = grants.expires_at_s(grant)

    def _refuse(self, identity: Identity, inode: int, reason: str, *, expired: bool) -> None:
        self.refused_total += 1
        n = self.refused_total
        if n <= 16 or n & (n - 1) == 0:
            logger.warning("refused a read of inode %d by token %s: %s (%d refused so far)", inode,
                           identity.token_id, reason, n)
        raise StatusError(Status.AUTH_EXPIRED if expired else Status.EACCES, f"read of inode {inode}: {reason}")

    def __repr__(self) -> str:
        return (f"ReadGrantCheck(on={self.key is not None} required={self.required} cached={len(self.granted)} "
                f"refused={self.refused_total})")
