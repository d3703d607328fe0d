"""Storage's check of write grants (``loomfs.common.grants``): chunk changes from clients.

Services (chain peers forwarding, meta's GC and trimmer, resync) hold ``Right.SERVICE`` and pass,
and so do admin tokens (client-side repairs such as ``layout scrub --repair`` write fragments of
files nobody opened; an admin can drain and re-table the cluster anyway). A client's write, truncate or removal must carry a grant meta issued for that inode to that
client's token; a grant that is present is always checked, a missing one is refused once
``required`` (``StorageConfig.write_grants_required``). Without a cluster secret there is no key
and nothing is checked (every caller is TRUSTED then anyway).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from loomfs.common import grants
from loomfs.common.identity import Identity, Right
from loomfs.errors import StatusError
from loomfs.wire.status import Status

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
