"""Hostile and broken peers: garbage, oversized frames, wrong CRCs, unknown methods, bad paths."""

from __future__ import annotations

import errno
import socket
import struct
import time
from pathlib import Path

import msgpack
import pytest

import loomfs
from loomfs.testing.rawauth import authenticate_socket
from loomfs.wire import frame as fr
from loomfs.wire.status import Status

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _send(addr: str, data: bytes, read: bool = True, token: Path | None = None) -> bytes:
    """``data`` on a fresh connection (after proving ``token``, when given) and the reply."""
    host, port = addr.split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        authenticate_socket(s, token)
        s.sendall(data)
        if not read:
            return b""
        s.settimeout(3)
        out = b""
        try:
            while True:
                b = s.recv(65536)
                if not b:
                    break
                out += b
                if len(out) >= fr.PREFIX_SIZE:
                    p = fr.parse_prefix(out, 1 << 30)
                    if len(out) >= fr.PREFIX_SIZE + p.header_len + p.payload_len:
                        break
        except (TimeoutError, ConnectionResetError):
            pass
        return out


def _reply_status(raw: bytes) -> int:
    _, h, _ = fr.decode_frame(raw, 1 << 30)
    return h.status


def _request(service: int, method: int, body: object, payload: bytes = b"", crc: int | None = None) -> bytes:
    raw = msgpack.packb([service, method, 1, 5000, 0, "", body])
    pc = fr.crc(payload) if crc is None else crc
    return fr.PREFIX.pack(fr.MAGIC, fr.VERSION, 0, len(raw), len(payload), pc, fr.crc(raw)) + raw + payload


def test_servers_survive_garbage(cluster, fs: loomfs.LoomFS, base: str) -> None:  # type: ignore[no-untyped-def]
    with fs.open(f"{base}/keep", "wb") as f:
        f.write(b"precious" * 1000)
    addrs = [s.address for s in cluster.services.values()]
    token = cluster.token_path  # the admin token: hand-built frames reach the handlers
    for addr in addrs:
        assert _send(addr, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n") == b""  # closed, no reply
        # oversized payload claim: refused before allocating 4 GiB
        huge = fr.PREFIX.pack(fr.MAGIC, fr.VERSION, 0, 10, 0xFFFFFFFF, 0, 0) + b"x" * 10
        assert _send(addr, huge) == b""
        # oversized header claim
        assert _send(addr, fr.PREFIX.pack(fr.MAGIC, fr.VERSION, 0, 0x7FFFFFFF, 0, 0, 0)) == b""
        # bad header CRC
        req = bytearray(_request(1, 6, {}))
        req[fr.PREFIX_SIZE + 2] ^= 0xFF
        assert _send(addr, bytes(req)) == b""
        # unknown method -> error status, connection fine
        assert _reply_status(_send(addr, _request(77, 99, {}), token=token)) == 1001
        # the same without credentials: refused before any method is looked up
        assert _reply_status(_send(addr, _request(77, 99, {}))) == Status.AUTH_REQUIRED
        # truncated frame then hang-up
        _send(addr, _request(1, 6, {})[:15], read=False)
    # storage: wrong payload CRC -> CHECKSUM_MISMATCH; malformed body -> BAD_REQUEST
    storage = cluster.services["storage1"].address
    st = _reply_status(_send(storage, _request(3, 1, {"length": 4}, b"abcd", crc=12345), token=token))
    assert st == 1002
    assert _reply_status(_send(storage, _request(3, 1, {"chunk": "nope"}), token=token)) == 1000
    meta = cluster.services["meta1"].address
    assert _reply_status(_send(meta, _request(2, 1, {"path": 12}), token=token)) == 1000
    time.sleep(0.2)
    # everyone is still up and the data is intact
    for s in cluster.services.values():
        assert s.alive(), s.name
    assert fs.cat(f"{base}/keep") == b"precious" * 1000


@pytest.mark.parametrize(
    "path, code",
    [("", errno.ENOENT), ("/a\0b", errno.EINVAL), ("/" + "x" * 256, errno.ENAMETOOLONG)],
)
def test_invalid_paths(fs: loomfs.LoomFS, path: str, code: int) -> None:
    for op in (fs.stat, fs.mkdir, lambda p: fs.open(p, "wb")):
        with pytest.raises(OSError) as ei:
            op(path)
        assert ei.value.errno == code


def test_dotdot_never_escapes_root(fs: loomfs.LoomFS, base: str) -> None:
    with fs.open(f"{base}/../../../{base}/inside", "wb") as f:
        f.write(b"1")
    assert fs.cat(f"{base}/inside") == b"1"
    assert fs.stat("/../..").st_ino == fs.stat("/").st_ino
    assert struct.calcsize("<I") == 4
