"""The blocking fast path's own frame code (``SyncMetaPath._roundtrip``): the request bytes
are exactly ``frame.encode``'s, and a reply is checked as ``frame.decode_header`` checks it
(a broken one is a ``FrameError``, which the fast path turns into the async fallback).
No sockets: the connection's socket is a scripted object."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from loomfs.client.fastpath import SyncMetaPath, _Conn
from loomfs.common import trace
from loomfs.wire import frame as fr
from loomfs.wire import meta as wmeta


class ScriptedSock:
    """Records what is sent; answers each ``recv_into`` with the next queued piece."""

    def __init__(self, pieces: list[bytes]):
        self.sent: list[bytes] = []
        self.pieces = pieces

    def sendall(self, data: bytes) -> None:
        self.sent.append(bytes(data))

    def recv_into(self, view: memoryview, nbytes: int = 0, flags: int = 0) -> int:
        if not self.pieces:
            return 0  # meta closed the connection
        piece = self.pieces.pop(0)
        view[: len(piece)] = piece
        return len(piece)

    def close(self) -> None:
        pass


def conn_with(pieces: list[bytes]) -> _Conn:
    conn = object.__new__(_Conn)
    conn.sock = ScriptedSock(pieces)  # type: ignore[assignment]
    conn.buf = bytearray(64)  # small: a reply bigger than this grows it
    conn.spin_ns = 0
    return conn


def reply(rid: int, body: dict[str, Any], *, status: int = 0, message: str = "",
          extra: bytes = b"", kind: int = fr.KIND_RESPONSE) -> bytes:
    h = fr.Header(3, 1, rid, 0, status, message, body, 0, 77)
    return fr.encode(kind, h) + extra


def path_and_rid(monkeypatch: pytest.MonkeyPatch, rid: int) -> SyncMetaPath:
    sp = SyncMetaPath(None, timeout_s=2.5)
    monkeypatch.setattr(SyncMetaPath, "_ids", itertools.count(rid))
    return sp


def test_request_bytes_are_frame_encode_s(monkeypatch: pytest.MonkeyPatch) -> None:
    sp = path_and_rid(monkeypatch, 41)
    body = wmeta.PathReq(path="/a/b", follow_symlinks=True).to_wire()
    conn = conn_with([reply(41, {"attr": None})])
    token = trace.TRACE.set(12345)
    try:
        status, message, got = sp._roundtrip(conn, wmeta.STAT.service, wmeta.STAT.method, body)
    finally:
        trace.TRACE.reset(token)
    assert (status, message, got) == (0, "", {"attr": None})
    want = fr.encode(fr.KIND_REQUEST, fr.Header(wmeta.STAT.service, wmeta.STAT.method, 41, 2500, 0, "",
                                                body, 0, 12345))
    assert conn.sock.sent == [want]  # type: ignore[attr-defined]


def test_a_reply_in_pieces_and_bigger_than_the_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    rid = 7
    sp = path_and_rid(monkeypatch, rid)
    big = {"data": b"x" * 5000}
    frame = reply(rid, big, status=2, message="ENOENT")
    conn = conn_with([frame[:7], frame[7:30], frame[30:]])
    assert sp._roundtrip(conn, 3, 1, {}) == (2, "ENOENT", big)
    assert len(conn.buf) >= len(frame)


@pytest.mark.parametrize("breakage", ["header_crc", "rid", "trailing", "kind", "magic", "closed", "body"])
def test_a_broken_reply_is_a_frame_error(monkeypatch: pytest.MonkeyPatch, breakage: str) -> None:
    sp = path_and_rid(monkeypatch, 900)
    good = reply(900, {"ok": 1})
    frame = {
        "header_crc": good[:-1] + bytes([good[-1] ^ 1]),
        "rid": reply(901, {"ok": 1}),
        "trailing": good + b"\0",
        "kind": reply(900, {"ok": 1}, kind=fr.KIND_REQUEST),
        "magic": b"XX" + good[2:],
        "closed": good[:10],
        "body": fr.encode(fr.KIND_RESPONSE, fr.Header(3, 1, 900, 0, 0, "", [1], 0)),  # type: ignore[arg-type]
    }[breakage]
    conn = conn_with([frame])
    with pytest.raises((fr.FrameError, ConnectionResetError)):
        sp._roundtrip(conn, 3, 1, {})
