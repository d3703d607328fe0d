"""Write grants: meta's signed permission for one token to change one inode's chunks.

Storage has no namespace, so it cannot check POSIX permissions itself. Meta, after it checked
them on an open/create for writing, mints a grant: ``(inode, expires_at_s, token_id)`` with an
HMAC under a key derived from the cluster secret. The client puts the grant into every chunk
write, truncate and remove it sends for that inode; storage verifies it (unless the caller is a
LoomFS service: a chain peer forwarding, meta's GC, a resync). A grant is bound to the token
that opened the file, so one copied off the wire is useless on another token's connection.

Read grants have the same form under another key (``read_grant_key``): meta mints one after
its read-permission check (READ_GRANTS, ``meta/readgrants.py``), the client sends it with every
chunk READ of that inode, and storage checks it (``storage/grantcheck.py: ReadGrantCheck``). A
write grant is never a read grant, nor the reverse (the keys differ).

Pure: no I/O, no clocks (the caller passes ``now_s``, wall-clock seconds).
"""

from __future__ import annotations

import hashlib
import hmac
import struct

GRANT_VERSION = 1
_HEAD = struct.Struct("<BQQ")  # version, inode, expires_at_s (unix seconds)
MAC_BYTES = 16
GRANT_BYTES = _HEAD.size + MAC_BYTES  # 33
DEFAULT_GRANT_TTL_S = 3600.0  # meta's default; the client renews before it runs out
_KEY_LABEL = b"loomfs-write-grant-v1"
_READ_KEY_LABEL = b"loomfs-read-grant-v1"


class GrantError(Exception):
    """The grant does not allow this write; ``reason`` says why (for the log and the status)."""

    def __init__(self, reason: str, *, expired: bool = False):
        super().__init__(reason)
        self.reason = reason
        self.expired = expired


def grant_key(secret: bytes) -> bytes:
    """The key grants are signed with (its own label: a grant is never a valid token proof)."""
    return hmac.new(secret, _KEY_LABEL, hashlib.sha256).digest()


def read_grant_key(secret: bytes) -> bytes:
    """The key read grants are signed with (not the write grants' key)."""
    return hmac.new(secret, _READ_KEY_LABEL, hashlib.sha256).digest()


def _mac(key: bytes, head: bytes, token_id: str) -> bytes:
    return hmac.new(key, head + token_id.encode(), hashlib.sha256).digest()[:MAC_BYTES]


def mint(key: bytes, inode: int, token_id: str, expires_at_s: float) -> bytes:
    """A grant for ``token_id`` to write ``inode`` until ``expires_at_s``. ``key``: grant_key()."""
    if not 0 <= inode < 1 << 64:
        raise ValueError(f"inode {inode} out of range")
    head = _HEAD.pack(GRANT_VERSION, inode, max(0, int(expires_at_s)))
    return head + _mac(key, head, token_id)


def expires_at_s(grant: bytes) -> float:
    """When a well-formed grant runs out (0.0 for a malformed one): the client renews before."""
    if len(grant) != GRANT_BYTES:
        return 0.0
    return float(_HEAD.unpack_from(grant)[2])


def verify(key: bytes, grant: bytes, inode: int, token_id: str, now_s: float) -> None:
    """Raise ``GrantError`` unless ``grant`` lets ``token_id`` write ``inode`` at ``now_s``."""
    if not grant:
        raise GrantError("no write grant (open the file for writing through meta first)")
    if len(grant) != GRANT_BYTES:
        raise GrantError(f"malformed write grant ({len(grant)} bytes)")
    version, g_inode, g_expires = _HEAD.unpack_from(grant)
    if version != GRANT_VERSION:
        raise GrantError(f"write grant version {version} unknown")
    head = bytes(grant[: _HEAD.size])
    if not hmac.compare_digest(_mac(key, head, token_id), bytes(grant[_HEAD.size :])):
        raise GrantError("write grant forged or issued to another token")
    if g_inode != inode:
        raise GrantError(f"write grant is for inode {g_inode}, not {inode}")
    if now_s > g_expires:
        raise GrantError(f"write grant expired {now_s - g_expires:.0f}s ago", expired=True)
