"""Who is calling: the identity a connection authenticated as (``loomfs.net.auth``).

Every server-side call carries one in ``CallContext.identity``. It comes from the credentials
the peer proved at connect time (a client token or the cluster secret), never from a request
body. A server that runs without a cluster secret (auth off: a test, the simulator, a trusted
single-host set-up) gives every call ``TRUSTED``, which may do everything, as before auth existed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

# a tenant's inode numbers (and so its chunk ids) are ``tenant << TENANT_SHIFT | n``: whether an
# inode belongs to a tenant is one shift and compare (``loomfs.meta.tenancy``, storage's check)
TENANT_SHIFT = 48


class Right(enum.IntFlag):
    """What a credential may do, beyond POSIX permissions on the files themselves."""

    NONE = 0
    READ = 1  # read data and metadata (subject to POSIX permissions)
    WRITE = 2  # change the namespace and file contents (subject to POSIX permissions)
    ADMIN = 4  # cluster administration: drain, chain tables, tokens, reports
    SERVICE = 8  # a LoomFS service (mgmtd, meta, storage) proven by the cluster secret

    @classmethod
    def user(cls) -> Right:
        return cls.READ | cls.WRITE

    @classmethod
    def all(cls) -> Right:
        return cls.READ | cls.WRITE | cls.ADMIN | cls.SERVICE


@dataclass(frozen=True, slots=True)
class Identity:
    """An authenticated caller. ``groups``: supplementary gids (``gid`` not repeated);
    ``tenant``: the tenant whose subtree the caller sees ("" = the whole namespace);
    ``token_id``: the credential's id, for logs and revocation ("" for services)."""

    uid: int
    gid: int
    groups: tuple[int, ...] = ()
    tenant: str = ""
    rights: Right = Right.user()
    token_id: str = ""
    # holds SERVICE or ADMIN: passes storage's per-chunk checks (tenant range, write grants).
    # Computed once here, since ``rights & flag`` on an IntFlag costs ~0.7 us per request
    privileged: bool = field(init=False, compare=False, repr=False, default=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "privileged", bool(int(self.rights) & int(Right.SERVICE | Right.ADMIN)))

    def can(self, right: Right) -> bool:
        return bool(self.rights & right) and (self.rights & right) == right

    def in_group(self, gid: int) -> bool:
        return gid == self.gid or gid in self.groups


# the identity of every call on a server that runs without a cluster secret
TRUSTED = Identity(uid=0, gid=0, rights=Right.all(), token_id="trusted")
# the identity of a peer that proved the cluster secret (another LoomFS service)
SERVICE = Identity(uid=0, gid=0, rights=Right.all(), token_id="service")
