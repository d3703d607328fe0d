"""meta service lock calls (methods 70-73): flock and POSIX byte-range locks across clients
(``loomfs.meta.locks`` has the rules).

A lock is named by inode (a lock outlives names: an open file whose name went keeps its
locks), kind (1 flock, 2 POSIX), the caller's client id and a 64-bit owner of its choosing
(a mount passes the kernel's ``lock_owner``), a type (0 unlock, 1 read/shared, 2
write/exclusive) and an inclusive byte range (``last`` 2**63-1: to the end of the file).
Every call carries ``lease_s``, how long meta keeps the client's locks without a renewal
(meta bounds it to 1..600 s); LOCK_RENEW renews, and answers ``held=False`` when the lease
had run out (every lock of the client is gone then). All four are idempotent: a re-sent
set or release leaves the same table.

The client id is the caller's own pick (random, positive), but meta keeps a user's locks
under that id bound to the user the connection authenticated as (``loomfs.meta.locks``:
``bound_client_id``): naming another user's client id names a client of one's own. Services
and admin tokens (and everyone on a cluster without a cluster secret) name stored ids as they
are. No field changed for this: older clients and servers speak the same messages.
"""

from __future__ import annotations

from loomfs.common.identity import Right
from loomfs.wire.message import Message, message, method
from loomfs.wire.types import SERVICE_META

OFFSET_MAX = (1 << 63) - 1


@message
class LockInfo(Message):
    """A held lock (the one in the way, for LOCK_SET and LOCK_GET). To a caller without ADMIN or
    SERVICE rights, a lock of another client comes with ``client_id`` and ``owner`` 0 (POSIX
    F_GETLK tells only a pid), one of its own client with the ``client_id`` it sent."""

    client_id: int = 0
    owner: int = 0
    type: int = 0
    first: int = 0
    last: int = OFFSET_MAX
    pid: int = 0


@message
class LockReq(Message):
    """LOCK_SET (take or drop; never waits), LOCK_GET (test, F_GETLK)."""

    inode: int = 0
    kind: int = 2
    client_id: int = 0
    owner: int = 0
    type: int = 0
    first: int = 0
    last: int = OFFSET_MAX
    pid: int = 0
    lease_s: float = 0.0


@message
class LockRsp(Message):
    """``granted``: the lock was taken (or dropped); else ``conflict`` is the lock in the way.
    For LOCK_GET, ``conflict`` None means the lock would be granted."""

    granted: bool = False
    conflict: LockInfo | None = None
    # LOCK_SET: the client's lease is a new one (none was live): locks it had before are gone
    lease_new: bool = False


@message
class LockReleaseReq(Message):
    """Every lock of (client, owner) of ``kind`` on ``inode`` goes: close(2), flock's release."""

    inode: int = 0
    kind: int = 2
    client_id: int = 0
    owner: int = 0


@message
class LockReleaseRsp(Message):
    released: int = 0


@message
class LockRenewReq(Message):
    """``drop``: the client ends cleanly (unmount): all its locks go now."""

    client_id: int = 0
    lease_s: float = 0.0
    drop: bool = False


@message
class LockRenewRsp(Message):
    held: bool = False  # the lease was live and is renewed; False: it had run out (locks lost) or none


LOCK_SET = method(SERVICE_META, 70, "lock_set", LockReq, LockRsp, idempotent=True, needs=Right.READ)
LOCK_GET = method(SERVICE_META, 71, "lock_get", LockReq, LockRsp, idempotent=True, needs=Right.READ)
LOCK_RELEASE = method(SERVICE_META, 72, "lock_release", LockReleaseReq, LockReleaseRsp, idempotent=True,
                      needs=Right.READ)
LOCK_RENEW = method(SERVICE_META, 73, "lock_renew", LockRenewReq, LockRenewRsp, idempotent=True, needs=Right.READ)
