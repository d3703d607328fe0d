"""Framing codec and message encoding (pure)."""

from __future__ import annotations

import struct

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from loomfs.errors import StatusError
from loomfs.wire import frame as fr
from loomfs.wire.message import METHODS
from loomfs.wire.meta import OpenReq
from loomfs.wire.storage import ChunkId, WriteReq
from loomfs.wire.types import Attr, Layout, RoutingInfo


def _frame(payload: bytes = b"abc", **kw: object) -> bytes:
    h = fr.Header(3, 1, 7, 1000, 0, "", {"x": 1})
    return fr.encode(fr.KIND_REQUEST, h, payload) + payload


def test_roundtrip() -> None:
    kind, h, p = fr.decode_frame(_frame(b"hello"))
    assert kind == fr.KIND_REQUEST and h.request_id == 7 and h.body == {"x": 1} and p == b"hello"


def test_bad_magic_version_kind() -> None:
    f = bytearray(_frame())
    f[0] ^= 0xFF
    with pytest.raises(fr.FrameError, match="magic"):
        fr.decode_frame(bytes(f))
    f = bytearray(_frame())
    f[2] = 9
    with pytest.raises(fr.FrameError, match="version"):
        fr.decode_frame(bytes(f))
    f = bytearray(_frame())
    f[3] = 5
    with pytest.raises(fr.FrameError, match="kind"):
        fr.decode_frame(bytes(f))


def test_oversized_lengths_rejected_before_allocation() -> None:
    huge = fr.PREFIX.pack(fr.MAGIC, fr.VERSION, 0, fr.MAX_HEADER_BYTES + 1, 0, 0, 0)
    with pytest.raises(fr.FrameError, match="header length"):
        fr.parse_prefix(huge, 1 << 20)
    huge = fr.PREFIX.pack(fr.MAGIC, fr.VERSION, 0, 10, (1 << 32) - 1, 0, 0)
    with pytest.raises(fr.FrameError, match="payload length"):
        fr.parse_prefix(huge, 64 << 20)


def test_header_crc_and_payload_crc() -> None:
    f = bytearray(_frame(b"payload"))
    f[fr.PREFIX_SIZE + 1] ^= 1
    with pytest.raises(fr.FrameError, match="header checksum"):
        fr.decode_frame(bytes(f))
    f = bytearray(_frame(b"payload"))
    f[-1] ^= 1
    with pytest.raises(fr.FrameError, match="payload checksum"):
        fr.decode_frame(bytes(f))


def test_header_not_array() -> None:
    raw = msgpack.packb({"a": 1})
    pre = fr.PREFIX.pack(fr.MAGIC, fr.VERSION, 0, len(raw), 0, 0, fr.crc(raw))
    with pytest.raises(fr.FrameError, match="7-item"):
        fr.decode_frame(pre + raw)


def test_message_roundtrip_nested() -> None:
    a = Attr(inode=5, size=10, layout=Layout(chunk_size=1 << 20, chains=[1, 2, 3]))
    assert Attr.from_wire(a.to_wire()) == a
    w = WriteReq(chunk=ChunkId(inode=1, index=2), offset=3, length=4)
    assert WriteReq.from_wire(msgpack.unpackb(msgpack.packb(w.to_wire()))) == w


def test_unknown_fields_ignored_and_defaults_filled() -> None:
    r = OpenReq.from_wire({"path": "/a", "future_field": [1, 2]})
    assert r.path == "/a" and r.flags == 0


@pytest.mark.parametrize("body", [{"path": 5}, {"flags": "x"}, {"flags": True}, [1, 2], None])
def test_wrong_types_are_bad_request(body: object) -> None:
    with pytest.raises(StatusError) as ei:
        OpenReq.from_wire(body)
    assert ei.value.status.name == "BAD_REQUEST"


def test_method_ids_unique_and_messages_default_constructible() -> None:
    keys = [m.key for m in METHODS]
    assert len(keys) == len(set(keys))
    for m in METHODS:
        assert m.request.from_wire(m.request().to_wire()) == m.request()
        assert m.response.from_wire(m.response().to_wire()) == m.response()


@given(st.binary(max_size=200))
def test_random_bytes_never_crash_decoder(data: bytes) -> None:
    try:
        fr.decode_frame(data)
    except fr.FrameError:
        pass


def test_routing_default() -> None:
    assert RoutingInfo.from_wire({}) == RoutingInfo()
    assert struct.calcsize("<HBBIIII") == fr.PREFIX_SIZE
