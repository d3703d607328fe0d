"""Credentials: the cluster secret, client tokens, and the files that hold them.

* The **cluster secret** (32 random bytes, hex in a 0600 file) is held by every service. A service
  authenticates with a key derived from it (``service_credential``) and is given ``SERVICE``.
* A **token** is a set of claims (id, tenant, uid, gid, groups, rights, expiry) plus its key,
  ``HMAC(secret, claims)``. Whoever holds the secret can recompute the key from the claims, so
  servers keep no token database; changing any claim (more rights, another uid, a later expiry)
  changes the key the holder would need. A token file (JSON, 0600) holds claims and key.

The key never crosses the wire: the handshake (``loomfs.wire.auth``) proves it over nonces.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from loomfs.common.identity import SERVICE, Identity, Right

CLAIMS_VERSION = 1
SECRET_BYTES = 32
KIND_TOKEN = "token"
KIND_SERVICE = "service"
_KEY_LABEL = b"loomfs-credential-v1\0"
_SERVICE_KEY_LABEL = b"loomfs-service-v1\0"
TOKEN_ID_CHARS_MAX = 64
GROUPS_MAX = 64  # supplementary groups a token may carry (NGROUPS is 65536; a bound on what we hash)


class CredentialError(ValueError):
    """A secret or token file is missing, unreadable, malformed or too open."""


@dataclass(frozen=True, slots=True)
class Claims:
    """What a credential says about its holder. ``expires_at_s``: unix seconds, 0 = never
    (services only: a token always expires)."""

    kind: str = KIND_TOKEN
    token_id: str = ""
    tenant: str = ""
    uid: int = 65534
    gid: int = 65534
    groups: tuple[int, ...] = ()
    rights: int = int(Right.user())
    expires_at_s: int = 0
    issued_at_s: int = 0

    def canonical(self) -> bytes:
        """The bytes the key is derived from (one encoding for every field order)."""
        return msgpack.packb([CLAIMS_VERSION, self.kind, self.token_id, self.tenant, self.uid, self.gid,
                              list(self.groups), self.rights, self.expires_at_s, self.issued_at_s])

    def to_wire(self) -> dict[str, Any]:
        return {"v": CLAIMS_VERSION, "kind": self.kind, "id": self.token_id, "tenant": self.tenant,
                "uid": self.uid, "gid": self.gid, "groups": list(self.groups), "rights": self.rights,
                "exp": self.expires_at_s, "iat": self.issued_at_s}

    @classmethod
    def from_wire(cls, data: Any) -> Claims:
        """Parse claims from a peer or a file; anything off raises CredentialError."""
        if not isinstance(data, dict) or data.get("v") != CLAIMS_VERSION:
            raise CredentialError("claims: not a version-1 map")
        try:
            kind, token_id, tenant = data["kind"], data["id"], data["tenant"]
            uid, gid, rights, exp, iat = data["uid"], data["gid"], data["rights"], data["exp"], data["iat"]
            groups = data["groups"]
        except KeyError as exc:
            raise CredentialError(f"claims: missing {exc}") from None
        if kind not in (KIND_TOKEN, KIND_SERVICE) or not isinstance(token_id, str) or not isinstance(tenant, str):
            raise CredentialError("claims: bad kind, id or tenant")
        if not 0 < len(token_id) <= TOKEN_ID_CHARS_MAX or len(tenant) > 255:
            raise CredentialError("claims: id or tenant length out of bounds")
        ints = (uid, gid, rights, exp, iat)
        if not all(type(v) is int and 0 <= v < 1 << 63 for v in ints):
            raise CredentialError("claims: uid, gid, rights and times must be non-negative integers")
        if not isinstance(groups, list) or len(groups) > GROUPS_MAX or not all(
                type(g) is int and 0 <= g < 1 << 32 for g in groups):
            raise CredentialError(f"claims: groups must be at most {GROUPS_MAX} gids")
        if uid >= 1 << 32 or gid >= 1 << 32 or rights & ~int(Right.all()):
            raise CredentialError("claims: uid/gid/rights out of range")
        return cls(kind, token_id, tenant, uid, gid, tuple(groups), rights, exp, iat)

    def identity(self) -> Identity:
        if self.kind == KIND_SERVICE:
            return SERVICE
        # a token never carries SERVICE: only the cluster secret proves a service
        rights = Right(self.rights) & ~Right.SERVICE
        return Identity(uid=self.uid, gid=self.gid, groups=tuple(g for g in self.groups if g != self.gid),
                        tenant=self.tenant, rights=rights, token_id=self.token_id)


@dataclass(frozen=True, slots=True)
class Credential:
    """Claims and the key that proves them (held by a client or a service, never sent)."""

    claims: Claims
    key: bytes = field(repr=False)


def derive_key(secret: bytes, claims: Claims) -> bytes:
    if claims.kind == KIND_SERVICE:
        return hmac.new(secret, _SERVICE_KEY_LABEL + claims.token_id.encode(), hashlib.sha256).digest()
    return hmac.new(secret, _KEY_LABEL + claims.canonical(), hashlib.sha256).digest()


def service_credential(secret: bytes, name: str = "service") -> Credential:
    claims = Claims(kind=KIND_SERVICE, token_id=f"service:{name}"[:TOKEN_ID_CHARS_MAX], uid=0, gid=0,
                    rights=int(Right.all()))
    return Credential(claims, derive_key(secret, claims))


def rights_for(*, read_only: bool = False, admin: bool = False) -> Right:
    if read_only and admin:
        raise ValueError("a token cannot be both read-only and admin")
    if read_only:
        return Right.READ
    return Right.user() | Right.ADMIN if admin else Right.user()


def create_token(secret: bytes, *, uid: int, gid: int, groups: tuple[int, ...] = (), tenant: str = "",
                 rights: Right | None = None, ttl_s: float, now_s: float) -> Credential:
    """A new token (random id) valid for ``ttl_s`` from ``now_s``; ``rights`` default: READ|WRITE."""
    rights = Right.user() if rights is None else rights
    if ttl_s <= 0:
        raise ValueError("a token needs a positive ttl")
    claims = Claims(kind=KIND_TOKEN, token_id=secrets.token_hex(8), tenant=tenant, uid=uid, gid=gid,
                    groups=tuple(groups), rights=int(rights & ~Right.SERVICE),
                    expires_at_s=int(now_s + ttl_s), issued_at_s=int(now_s))
    Claims.from_wire(claims.to_wire())  # the same bounds a server applies
    return Credential(claims, derive_key(secret, claims))


# ---- files ------------------------------------------------------------------------------------
def _write_private(path: Path, text: str) -> None:
    """Create (or replace) ``path`` with mode 0600 from the first byte on."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _read_private(path: str | Path, what: str) -> str:
    try:
        st = os.stat(path)
        text = Path(path).read_text()
    except OSError as exc:
        raise CredentialError(f"{what} {path}: {exc.strerror or exc}") from exc
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise CredentialError(f"{what} {path} is readable by others (mode {st.st_mode & 0o777:o}); "
                              f"chmod 600 {path}")
    return text


def write_secret_file(path: str | Path, secret: bytes | None = None) -> bytes:
    """A new cluster secret (or ``secret``) in ``path``, mode 0600; returns it."""
    secret = secret if secret is not None else secrets.token_bytes(SECRET_BYTES)
    _write_private(Path(path), secret.hex() + "\n")
    return secret


def load_secret_file(path: str | Path) -> bytes:
    text = _read_private(path, "cluster secret").strip()
    try:
        secret = bytes.fromhex(text)
    except ValueError:
        raise CredentialError(f"cluster secret {path}: not hex") from None
    if len(secret) < 16:
        raise CredentialError(f"cluster secret {path}: {len(secret)} bytes, at least 16 needed")
    return secret


def token_text(cred: Credential) -> str:
    return json.dumps({"loomfs_token": 1, "claims": cred.claims.to_wire(), "key": cred.key.hex()}, indent=1) + "\n"


def write_token_file(path: str | Path, cred: Credential) -> None:
    _write_private(Path(path), token_text(cred))


def load_token_file(path: str | Path) -> Credential:
    text = _read_private(path, "token file")
    try:
        data = json.loads(text)
        claims = Claims.from_wire(data["claims"])
        key = bytes.fromhex(data["key"])
    except (ValueError, KeyError, TypeError) as exc:
        raise CredentialError(f"token file {path}: malformed ({exc})") from None
    if claims.kind != KIND_TOKEN or len(key) != 32:
        raise CredentialError(f"token file {path}: not a client token")
    return Credential(claims, key)
