"""Connection handshake (service id 0): the first two requests on an authenticated connection.

    client -> HELLO {client_nonce}                     server -> {server_nonce, auth_required}
    client -> PROVE {claims, proof}                    server -> {server_proof, token_id}

``proof = HMAC(key, "loomfs-auth-client" | server_nonce | client_nonce)`` where ``key`` is the
credential's key (a token's, or the service key derived from the cluster secret); the server
recomputes ``key`` from the claims and its secret, so the key never crosses the wire and a proof
copied from one connection fails on any other (a fresh server nonce each time).
``server_proof`` (the same with the nonces swapped) shows the client the server holds the secret.
The RPC server answers these inline, before any other request of the connection is read on.
"""

from __future__ import annotations

from typing import Any

from loomfs.wire.message import Empty, Message, many, message, method
from loomfs.wire.types import SERVICE_MGMTD

SERVICE_AUTH = 0
NONCE_BYTES = 16
PROOF_BYTES = 32


@message
class HelloReq(Message):
    client_nonce: bytes = b""


@message
class HelloRsp(Message):
    server_nonce: bytes = b""
    auth_required: bool = False  # False: the server runs without a cluster secret (PROVE not needed)


@message
class ProveReq(Message):
    claims: dict[str, Any] | None = None  # loomfs.net.auth.Claims.to_wire()
    proof: bytes = b""


@message
class ProveRsp(Message):
    server_proof: bytes = b""
    token_id: str = ""


HELLO = method(SERVICE_AUTH, 1, "auth_hello", HelloReq, HelloRsp)
PROVE = method(SERVICE_AUTH, 2, "auth_prove", ProveReq, ProveRsp)


# ---- revoked tokens, kept by mgmtd (``loomfs.net.revocations``); ids 100+ of mgmtd are auth's --
@message
class RevokeTokenReq(Message):
    token_id: str = ""
    until_s: float = 0.0  # the token's expiry (unix s): kept until then; 0 = a year from now


@message
class RevokedRsp(Message):
    token_ids: list[str] = many()
    until_s: list[float] = many()  # parallel to token_ids


REVOKE_TOKEN = method(SERVICE_MGMTD, 100, "revoke_token", RevokeTokenReq, RevokedRsp)
LIST_REVOKED = method(SERVICE_MGMTD, 101, "list_revoked", Empty, RevokedRsp, idempotent=True)
