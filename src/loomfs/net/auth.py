"""Authentication of connections: who may talk to a LoomFS server, and as whom.

A server with a cluster secret (``AuthConfig.secret``) answers nothing but the handshake
(``loomfs.wire.auth``) until the peer proved a credential: a service key derived from the secret
(-> ``SERVICE``) or a client token (-> the token's uid/gid/groups/tenant/rights). Without a secret
every connection is ``TRUSTED`` (unit tests, the simulator, a trusted single-host set-up).

``AuthConfig`` travels on the Transport (``transport.auth``), so the RPC server and client of a
process find it where they find their sockets; ``default_transport()`` takes the process's
(``set_process_auth`` from each service's ``[rpc]`` config; for clients ``LOOMFS_TOKEN_FILE``).
TLS (``tls_*`` files) wraps every TCP connection when configured; the handshake runs inside it.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from loomfs.common import grants
from loomfs.common.identity import Identity, Right
from loomfs.net import revocations
from loomfs.net.credentials import (
    KIND_SERVICE,
    Claims,
    Credential,
    CredentialError,
    derive_key,
    load_secret_file,
    load_token_file,
    service_credential,
)
from loomfs.wire.auth import NONCE_BYTES
from loomfs.wire.status import Status

logger = logging.getLogger(__name__)

TOKEN_FILE_ENV = "LOOMFS_TOKEN_FILE"
SECRET_FILE_ENV = "LOOMFS_SECRET_FILE"
TLS_CA_FILE_ENV = "LOOMFS_TLS_CA_FILE"  # clients: the CA of the services' certificates (TLS on)
_CLIENT_LABEL = b"loomfs-auth-client\0"
_SERVER_LABEL = b"loomfs-auth-server\0"
REVOKED_RELOAD_S = 1.0  # the revocation file is re-read at most this often (on handshakes)

# the identity of a connection that has not authenticated (yet) on a server that needs it
UNAUTHENTICATED = Identity(uid=65534, gid=65534, rights=Right.NONE, token_id="")


class AuthError(Exception):
    def __init__(self, status: Status, reason: str):
        super().__init__(reason)
        self.status = status
        self.reason = reason


def client_proof(key: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return hmac.new(key, _CLIENT_LABEL + server_nonce + client_nonce, hashlib.sha256).digest()


def server_proof(key: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return hmac.new(key, _SERVER_LABEL + client_nonce + server_nonce, hashlib.sha256).digest()


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


@dataclass(slots=True)
class Verified:
    identity: Identity
    expires_at_s: float  # 0 = never
    server_proof: bytes


class Verifier:
    """The server side: checks claims + proof against the cluster secret (and the revocation list)."""

    def __init__(self, secret: bytes, *, revoked_file: str = "", wall_clock: Callable[[], float] = time.time):
        self._secret = secret
        self.revoked_file = revoked_file
        self.wall_clock = wall_clock
        self._revoked: frozenset[str] = frozenset()
        self._revoked_checked_at = -1e18
        self._revoked_mtime = 0.0

    def verify(self, claims_wire: Any, proof: bytes, server_nonce: bytes, client_nonce: bytes) -> Verified:
        try:
            claims = Claims.from_wire(claims_wire)
        except CredentialError as exc:
            raise AuthError(Status.AUTH_FAILED, f"malformed credential: {exc}") from None
        key = derive_key(self._secret, claims)
        if len(proof) != 32 or not hmac.compare_digest(client_proof(key, server_nonce, client_nonce), proof):
            what = "cluster secret" if claims.kind == KIND_SERVICE else f"token {claims.token_id}"
            raise AuthError(Status.AUTH_FAILED, f"{what}: proof does not match (forged credential, another "
                                                "cluster's secret, or a proof replayed from another connection)")
        now = self.wall_clock()
        if claims.kind != KIND_SERVICE:
            if claims.expires_at_s <= 0 or now > claims.expires_at_s:
                raise AuthError(Status.AUTH_EXPIRED, f"token {claims.token_id} expired "
                                                     f"{now - claims.expires_at_s:.0f}s ago")
            if claims.token_id in self.revoked(now) or claims.token_id in revocations.PROCESS.ids:
                raise AuthError(Status.AUTH_REVOKED, f"token {claims.token_id} is revoked")
        return Verified(claims.identity(), float(claims.expires_at_s), server_proof(key, server_nonce, client_nonce))

    def is_revoked(self, token_id: str) -> bool:
        """Per call of an open connection: the lists as last read (no file access here)."""
        return token_id in self._revoked or token_id in revocations.PROCESS.ids

    def revoked(self, now: float) -> frozenset[str]:
        """Token ids in ``revoked_file`` (one per line, ``#`` comments), re-read when it changed."""
        if not self.revoked_file or now - self._revoked_checked_at < REVOKED_RELOAD_S:
            return self._revoked
        self._revoked_checked_at = now
        try:
            mtime = os.stat(self.revoked_file).st_mtime
            if mtime != self._revoked_mtime:
                with open(self.revoked_file) as f:
                    ids = {line.split("#", 1)[0].strip() for line in f}
                self._revoked = frozenset(i for i in ids if i)
                self._revoked_mtime = mtime
        except FileNotFoundError:
            self._revoked = frozenset()
        except OSError as exc:
            logger.warning("revocation list %s unreadable (keeping %d ids): %s", self.revoked_file,
                           len(self._revoked), exc)
        return self._revoked


class TokenSource:
    """A token file, read again when it changes (a renewed token is used by the next connection)."""

    def __init__(self, path: str, cred: Credential):
        self.path = path
        self._cred = cred
        self._mtime = self._stat()

    def _stat(self) -> float:
        try:
            return os.stat(self.path).st_mtime
        except OSError:
            return 0.0

    def current(self) -> Credential:
        mtime = self._stat()
        if mtime != self._mtime:
            self._mtime = mtime
            try:
                self._cred = load_token_file(self.path)
                logger.info("token file %s changed: now token %s", self.path, self._cred.claims.token_id)
            except CredentialError as exc:  # half-written or removed: keep the one we had
                logger.warning("token file %s changed but cannot be used (keeping token %s): %s", self.path,
                               self._cred.claims.token_id, exc)
        return self._cred

    def __repr__(self) -> str:
        return f"TokenSource({self.path} token={self._cred.claims.token_id})"


@dataclass(frozen=True, slots=True)
class AuthConfig:
    """What one process authenticates with. ``secret``: servers verify peers with it and calls
    to other services prove ``SERVICE``; ``credential``: a client token (used when the process has
    no secret); ``tls_*``: SSL contexts for every TCP connection (None = plain TCP)."""

    secret: bytes | None = field(default=None, repr=False)
    credential: Credential | None = None
    revoked_file: str = ""
    tls_server: ssl.SSLContext | None = None
    tls_client: ssl.SSLContext | None = None
    name: str = "service"
    token_source: TokenSource | None = None  # where ``credential`` came from (re-read when it changes)

    def verifier(self) -> Verifier | None:
        return Verifier(self.secret, revoked_file=self.revoked_file) if self.secret else None

    def outgoing(self) -> Credential | None:
        """The credential this process proves when it calls a server."""
        if self.secret is not None:
            return service_credential(self.secret, self.name)
        if self.token_source is not None:
            return self.token_source.current()
        return self.credential

    def grant_key(self) -> bytes | None:
        return grants.grant_key(self.secret) if self.secret else None

    def read_grant_key(self) -> bytes | None:
        return grants.read_grant_key(self.secret) if self.secret else None


def tls_contexts(cert_file: str, key_file: str, ca_file: str) -> tuple[ssl.SSLContext | None, ssl.SSLContext | None]:
    """(server, client) contexts. The server presents ``cert_file``; clients verify servers
    against ``ca_file`` (hostname = the address dialled, so certificates name the service's IP
    or DNS name). A process without cert/key (a pure client) gets only the client context."""
    server = None
    if cert_file:
        server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server.load_cert_chain(cert_file, key_file or None)
    client = None
    if ca_file:
        client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    elif cert_file:
        raise CredentialError("tls: a tls_ca_file is needed to verify the other services")
    return server, client


def auth_config(*, secret_file: str = "", token_file: str = "", revoked_file: str = "", tls_cert_file: str = "",
                tls_key_file: str = "", tls_ca_file: str = "", name: str = "service") -> AuthConfig:
    """Load the files a process's ``[rpc]`` config names (empty = not used)."""
    secret = load_secret_file(secret_file) if secret_file else None
    cred = load_token_file(token_file) if token_file else None
    tls_server, tls_client = tls_contexts(tls_cert_file, tls_key_file, tls_ca_file) if (
        tls_cert_file or tls_ca_file) else (None, None)
    source = TokenSource(token_file, cred) if cred is not None else None
    return AuthConfig(secret=secret, credential=cred, token_source=source, revoked_file=revoked_file, tls_server=tls_server,
                      tls_client=tls_client, name=name)


def from_rpc_config(rpc: Any, *, name: str = "service") -> AuthConfig:
    """An ``AuthConfig`` from a ``config.RpcConfig``; a client's token falls back to $LOOMFS_TOKEN_FILE."""
    token_file = rpc.token_file or ("" if rpc.secret_file else env_token_file())
    ca_file = rpc.tls_ca_file or ("" if rpc.tls_cert_file else os.environ.get(TLS_CA_FILE_ENV, ""))
    return auth_config(secret_file=rpc.secret_file, token_file=token_file, revoked_file=rpc.revoked_file,
                       tls_cert_file=rpc.tls_cert_file, tls_key_file=rpc.tls_key_file,
                       tls_ca_file=ca_file, name=name)


# ---- the process's configuration ----------------------------------------------------------------
_process: AuthConfig | None = None
_process_set = False
_from_env: tuple[tuple[str, str, str, float], AuthConfig | None] = (("", "", "", 0.0), None)
CLUSTER_TOKEN_FILE = "admin.token"  # in a ``loomfs local up`` directory


def set_process_auth(config: AuthConfig | None) -> None:
    """What ``default_transport()`` uses in this process (a service's main sets it from its config)."""
    global _process, _process_set
    _process, _process_set = config, True


def env_token_file() -> str:
    """$LOOMFS_TOKEN_FILE, else the admin token of the local cluster $LOOMFS_CLUSTER names
    (``cluster_token_file``)."""
    cluster = os.environ.get("LOOMFS_CLUSTER", "")
    if cluster and os.path.isdir(cluster):
        return cluster_token_file(cluster)
    return os.environ.get(TOKEN_FILE_ENV, "")


def cluster_token_file(root: str | os.PathLike[str]) -> str:
    """The token to use with the local cluster directory ``root``: $LOOMFS_TOKEN_FILE when it is a
    token of that cluster (or when its secret cannot be read to tell), else ``root/admin.token``.
    (A $LOOMFS_TOKEN_FILE of another cluster, e.g. a test session's, would only be refused.)"""
    env = os.environ.get(TOKEN_FILE_ENV, "")
    admin = os.path.join(root, CLUSTER_TOKEN_FILE)
    if not os.path.isfile(admin):
        return env
    if not env:
        return admin
    try:
        secret = load_secret_file(os.path.join(root, "cluster.secret"))
        cred = load_token_file(env)
    except CredentialError:
        return env  # cannot tell: the user's choice stands (a bad file is reported when used)
    return env if derive_key(secret, cred.claims) == cred.key else admin


def process_auth() -> AuthConfig | None:
    """The process's AuthConfig: as set, else from $LOOMFS_SECRET_FILE / ``env_token_file()`` /
    $LOOMFS_TLS_CA_FILE (read again when those change; None when there is none: no auth)."""
    global _from_env
    if _process_set:
        return _process
    secret_file, token_file = os.environ.get(SECRET_FILE_ENV, ""), env_token_file()
    ca_file = os.environ.get(TLS_CA_FILE_ENV, "")
    if not secret_file and not token_file and not ca_file:
        return None
    try:
        mtime = os.stat(token_file or secret_file or ca_file).st_mtime
    except OSError:
        mtime = 0.0
    key = (secret_file, token_file, ca_file, mtime)
    if _from_env[0] != key:
        try:
            cfg: AuthConfig | None = auth_config(secret_file=secret_file, token_file=token_file, tls_ca_file=ca_file)
        except CredentialError as exc:  # e.g. a token file removed since: say so once, go on without
            logger.warning("credentials from the environment unusable, connecting without them: %s", exc)
            cfg = None
        _from_env = (key, cfg)
    return _from_env[1]


def process_grant_key() -> bytes | None:
    """The key meta signs write grants with (``loomfs.common.grants``); None without a secret."""
    cfg = process_auth()
    return cfg.grant_key() if cfg is not None else None


def process_read_grant_key() -> bytes | None:
    """The key meta signs read grants with; None without a secret."""
    cfg = process_auth()
    return cfg.read_grant_key() if cfg is not None else None
