"""Status codes carried on the wire.

Codes below 1000 are POSIX errno values (the namespace and data errors a file system
reports); codes from 1000 up are LoomFS protocol conditions that clients handle themselves
(refresh routing, retry at the tail, back off) and normally never show to users.
"""

from __future__ import annotations

import errno
from enum import IntEnum


class Status(IntEnum):
    OK = 0
    # POSIX errors (value == errno)
    EPERM = errno.EPERM
    ENOENT = errno.ENOENT
    EIO = errno.EIO
    EBADF = errno.EBADF
    EAGAIN = errno.EAGAIN
    EACCES = errno.EACCES
    EBUSY = errno.EBUSY
    EEXIST = errno.EEXIST
    EXDEV = errno.EXDEV
    ENOTDIR = errno.ENOTDIR
    EISDIR = errno.EISDIR
    EINVAL = errno.EINVAL
    EFBIG = errno.EFBIG
    ENOSPC = errno.ENOSPC
    EROFS = errno.EROFS
    EMLINK = errno.EMLINK
    ENAMETOOLONG = errno.ENAMETOOLONG
    ENOTEMPTY = errno.ENOTEMPTY
    ELOOP = errno.ELOOP
    ENODATA = errno.ENODATA
    ETIMEDOUT = errno.ETIMEDOUT
    ENOTSUP = errno.ENOTSUP
    E2BIG = errno.E2BIG  # an extended attribute's value over 64 KiB
    ERANGE = errno.ERANGE  # an extended attribute's name empty or over 255 bytes
    # protocol conditions
    BAD_REQUEST = 1000  # malformed message body
    UNKNOWN_METHOD = 1001
    CHECKSUM_MISMATCH = 1002  # payload CRC32C did not match
    INTERNAL = 1003  # server bug; the message says what
    DEADLINE_EXCEEDED = 1004
    SHUTTING_DOWN = 1005
    STALE_CHAIN_VERSION = 1010  # request carried an old chain version: refresh routing
    NOT_HEAD = 1011  # client write sent to a target that is not the chain head
    NOT_COMMITTED = 1012  # replica holds a pending version: retry at the tail
    TARGET_NOT_SERVING = 1013
    CHAIN_UNAVAILABLE = 1014  # successor unreachable; the chain is being reconfigured
    UNKNOWN_TARGET = 1015
    VERSION_MISMATCH = 1016  # forwarded update does not follow the local version
    NOT_PRIMARY = 1020  # mgmtd standby
    NO_CHAIN_TABLE = 1021
    TOO_MANY_CONNECTIONS = 1030  # the server is at its connection cap: nothing was processed
    # authentication (``loomfs.net.auth``): the client raises PermissionError (EACCES) for these
    AUTH_REQUIRED = 1040  # the server needs credentials and the connection presented none
    AUTH_FAILED = 1041  # forged token, wrong secret, replayed or malformed proof
    AUTH_EXPIRED = 1042  # the token (or a write grant) ran out
    AUTH_REVOKED = 1043  # the token's id is on the revocation list

    @property
    def is_errno(self) -> bool:
        return 0 < self.value < 1000


RETRYABLE = frozenset(
    {
        Status.EAGAIN,
        Status.STALE_CHAIN_VERSION,
        Status.NOT_HEAD,
        Status.NOT_COMMITTED,
        Status.TARGET_NOT_SERVING,
        Status.CHAIN_UNAVAILABLE,
        Status.SHUTTING_DOWN,
        Status.UNKNOWN_TARGET,
        Status.CHECKSUM_MISMATCH,
    }
)


AUTH_STATUSES = frozenset({Status.AUTH_REQUIRED, Status.AUTH_FAILED, Status.AUTH_EXPIRED, Status.AUTH_REVOKED})


def status_of(code: int) -> Status:
    try:
        return Status(code)
    except ValueError:
        return Status.INTERNAL
