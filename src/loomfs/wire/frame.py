"""Frame format (pure; no I/O).

Every message on a LoomFS connection is one frame::

    prefix (20 bytes, little-endian)
        magic        u16  0x4C4D ("LM")
        version      u8   1
        kind         u8   0 request, 1 response
        header_len   u32  bytes of msgpack header that follow
        payload_len  u32  bytes of raw payload after the header
        payload_crc  u32  CRC32C of the payload
        header_crc   u32  CRC32C of the header bytes
    header   msgpack array [service, method, request_id, deadline_ms, status, message, body]
    payload  raw bytes (chunk data); never interpreted by the framing layer

Sizes are checked against bounds *before* anything is allocated; a frame that breaks the
rules raises ``FrameError`` and the connection carrying it is closed (and only that one).
"""

from __future__ import annotations

import struct
import threading
from dataclasses import dataclass
from typing import Any

import crc32c
import msgpack

MAGIC = 0x4C4D
VERSION = 1
KIND_REQUEST = 0
KIND_RESPONSE = 1

PREFIX = struct.Struct("<HBBIIII")
PREFIX_SIZE = PREFIX.size  # 20

MAX_HEADER_BYTES = 1 << 20
DEFAULT_MAX_PAYLOAD_BYTES = 64 << 20


class FrameError(Exception):
    """The byte stream is not a valid frame sequence; close the connection."""


@dataclass(slots=True)  # not frozen: built for every frame received (frozen init is twice the cost)
class Prefix:
    kind: int
    header_len: int
    payload_len: int
    payload_crc: int
    header_crc: int


@dataclass(slots=True)
class Header:
    service: int
    method: int
    request_id: int
    deadline_ms: int  # remaining time at send; 0 = none
    status: int
    message: str
    body: dict[str, Any]
    payload_crc: int = 0  # filled in on receipt from the prefix (not part of the encoding)
    trace: int = 0  # request trace id (optional 8th header item; older peers ignore it)
    wire_bytes: int = 0  # length of the encoded header, filled in on decode (not encoded)


def crc(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    return crc32c.crc32c(data, value)


def parse_prefix(buf: bytes | bytearray | memoryview, max_payload_bytes: int) -> Prefix:
    if len(buf) < PREFIX_SIZE:
        raise FrameError("short prefix")
    magic, version, kind, hlen, plen, pcrc, hcrc = PREFIX.unpack_from(buf, 0)
    if magic != MAGIC:
        raise FrameError(f"bad magic 0x{magic:04x}")
    if version != VERSION:
        raise FrameError(f"unsupported frame version {version}")
    if kind not in (KIND_REQUEST, KIND_RESPONSE):
        raise FrameError(f"bad frame kind {kind}")
    if hlen == 0 or hlen > MAX_HEADER_BYTES:
        raise FrameError(f"header length {hlen} out of bounds")
    if plen > max_payload_bytes:
        raise FrameError(f"payload length {plen} exceeds limit {max_payload_bytes}")
    return Prefix(kind, hlen, plen, pcrc, hcrc)


def decode_header(prefix: Prefix, raw: bytes | bytearray | memoryview) -> Header:
    if crc(raw) != prefix.header_crc:
        raise FrameError("header checksum mismatch")
    try:
        items = msgpack.unpackb(raw, raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:  # msgpack raises several types
        raise FrameError(f"undecodable header: {exc}") from exc
    if not isinstance(items, list) or len(items) < 7:
        raise FrameError("header is not a 7-item array")
    service, method, request_id, deadline_ms, status, message, body = items[:7]
    trace = items[7] if len(items) > 7 and isinstance(items[7], int) and 0 <= items[7] < 1 << 64 else 0
    if not (isinstance(service, int) and isinstance(method, int) and isinstance(request_id, int)
            and isinstance(deadline_ms, int) and isinstance(status, int)):
        raise FrameError("header ids must be integers")
    if not isinstance(message, str) or not isinstance(body, dict):
        raise FrameError("header message/body have wrong types")
    return Header(service, method, request_id, deadline_ms, status, message, body, 0, trace, len(raw))


class _Packers(threading.local):
    """One msgpack ``Packer`` per thread, reused for every header it encodes.

    ``msgpack.packb`` builds a new ``Packer`` per call, and each allocates (and frees) a
    1 MiB buffer: in a process without meta's malloc settings (``common.malloc_tune``: a
    client) that came to ~18 us per call here (brk and first-touch page faults; profiled
    in-process), a reused one ~0.4 us. A ``Packer`` is not shared between threads; one
    whose ``pack`` raised starts its next call empty (msgpack resets it)."""

    def __init__(self) -> None:
        self.packer = msgpack.Packer(use_bin_type=True, autoreset=True)


_packers = _Packers()


PACKER_KEEP_BYTES = 4 << 20  # a Packer that grew past this for a big header is dropped after it


def pack(obj: Any) -> bytes:
    """``msgpack.packb(obj, use_bin_type=True)`` with this thread's reused ``Packer``."""
    raw: bytes = _packers.packer.pack(obj)
    if len(raw) > PACKER_KEEP_BYTES:  # its buffer grew as big: do not keep that much per thread
        _packers.packer = msgpack.Packer(use_bin_type=True, autoreset=True)
    return raw


def encode(
    kind: int,
    header: Header,
    payload: bytes | bytearray | memoryview | None = None,
    payload_crc: int | None = None,
) -> bytes:
    """Prefix + header bytes; the payload is sent separately (not copied)."""
    raw = pack(
        [
            header.service,
            header.method,
            header.request_id,
            header.deadline_ms,
            header.status,
            header.message,
            header.body,
            *((header.trace,) if header.trace else ()),
        ]
    )
    plen = 0 if payload is None else len(payload)
    if payload_crc is None:
        payload_crc = crc(payload) if payload is not None and plen else 0
    return PREFIX.pack(MAGIC, VERSION, kind, len(raw), plen, payload_crc, crc(raw)) + raw


def decode_frame(data: bytes, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> tuple[int, Header, bytes]:
    """Decode one whole frame held in memory (tests, the simulator)."""
    prefix = parse_prefix(data, max_payload_bytes)
    end_h = PREFIX_SIZE + prefix.header_len
    end_p = end_h + prefix.payload_len
    if len(data) != end_p:
        raise FrameError("frame length mismatch")
    header = decode_header(prefix, memoryview(data)[PREFIX_SIZE:end_h])
    payload = data[end_h:end_p]
    if prefix.payload_len and crc(payload) != prefix.payload_crc:
        raise FrameError("payload checksum mismatch")
    return prefix.kind, header, payload
