"""The connection handshake over a plain blocking socket, for tests that hand-build frames
(hostile-peer fuzzers): ``authenticate_socket(sock, cluster.token_path)`` before the frames."""

from __future__ import annotations

import socket
from pathlib import Path

from loomfs.net.auth import client_proof, new_nonce
from loomfs.net.credentials import load_token_file
from loomfs.wire import auth as wa
from loomfs.wire import frame as fr
from loomfs.wire.status import Status


def _exchange(sock: socket.socket, rid: int, m: object, body: dict[str, object]) -> fr.Header:
    assert isinstance(m, type(wa.HELLO))
    sock.sendall(fr.encode(fr.KIND_REQUEST, fr.Header(m.service, m.method, rid, 0, 0, "", body)))
    buf = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed during the handshake")
        buf += chunk
        if len(buf) >= fr.PREFIX_SIZE:
            p = fr.parse_prefix(buf, fr.DEFAULT_MAX_PAYLOAD_BYTES)
            end = fr.PREFIX_SIZE + p.header_len + p.payload_len
            if len(buf) >= end:
                _, header, _ = fr.decode_frame(buf[:end])
                return header


def authenticate_socket(sock: socket.socket, token_file: str | Path | None) -> None:
    """Prove ``token_file``'s token on ``sock`` (nothing when None: a cluster without auth)."""
    if token_file is None:
        return
    cred = load_token_file(token_file)
    cn = new_nonce()
    hello = _exchange(sock, 1 << 62, wa.HELLO, wa.HelloReq(client_nonce=cn).to_wire())
    rsp = wa.HelloRsp.from_wire(hello.body)
    if not rsp.auth_required:
        return
    proof = client_proof(cred.key, rsp.server_nonce, cn)
    out = _exchange(sock, (1 << 62) + 1, wa.PROVE, wa.ProveReq(claims=cred.claims.to_wire(), proof=proof).to_wire())
    if out.status != Status.OK:
        raise PermissionError(f"handshake refused: {out.message}")
