"""Fuzzing the frame decoder (bounded time: hypothesis, no database, fixed example counts).

Whatever bytes arrive, the decoder either yields frames or raises ``FrameError`` (the
connection is closed); it never raises anything else, never asks for a payload buffer
larger than the limit and never grows its receive buffer past its bound. The corpus in
tests/fuzz_corpus/frames/ (valid frames and the hostile ones found so far) is replayed too.
"""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loomfs.net.protocol import INITIAL_RECV_BYTES, FrameProtocol
from loomfs.wire import frame as fr

CORPUS = Path(__file__).resolve().parents[1] / "fuzz_corpus" / "frames"
MAX_PAYLOAD = 1 << 20
FUZZ = settings(max_examples=300, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _header_items() -> st.SearchStrategy[Any]:
    ints = st.one_of(st.integers(-(1 << 63), (1 << 64) - 1), st.sampled_from([0, 1, -1, 1 << 63, (1 << 64) - 1]))
    leaf = st.one_of(st.none(), st.booleans(), ints, st.floats(), st.text(max_size=20), st.binary(max_size=20))
    tree = st.recursive(leaf, lambda c: st.one_of(st.lists(c, max_size=4),
                                                  st.dictionaries(st.text(max_size=8), c, max_size=4)),
                        max_leaves=12)
    return st.lists(tree, max_size=9)


def _prefix(kind: int, hlen: int, plen: int, pcrc: int, hcrc: int, magic: int = fr.MAGIC,
            version: int = fr.VERSION) -> bytes:
    return fr.PREFIX.pack(magic, version, kind, hlen, plen, pcrc, hcrc)


def _frame(items: list[Any], payload: bytes, kind: int = fr.KIND_REQUEST) -> bytes:
    raw = msgpack.packb(items, use_bin_type=True)
    return _prefix(kind, len(raw), len(payload), fr.crc(payload) if payload else 0, fr.crc(raw)) + raw + payload


class Sink:
    def __init__(self) -> None:
        self.frames = 0
        self.biggest = 0

    def payload_buffer(self, kind: int, header: fr.Header, length: int) -> memoryview:
        assert 0 < length <= MAX_PAYLOAD
        self.biggest = max(self.biggest, length)
        return memoryview(bytearray(length))

    def frame_received(self, kind: int, header: fr.Header, payload: memoryview, crc_ok: bool) -> None:
        assert isinstance(header.body, dict) and isinstance(header.message, str)
        self.frames += 1

    def connection_lost(self, exc: BaseException | None) -> None:
        pass


class Tr:
    aborted = False

    def get_extra_info(self, name: str) -> Any:
        return None

    def set_write_buffer_limits(self, high: int, low: int) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def abort(self) -> None:
        self.aborted = True


def _stream(data: bytes, cuts: list[int]) -> tuple[Sink, Tr, FrameProtocol]:
    """Feed ``data`` to a fresh protocol in pieces; returns what it saw."""
    async def go() -> tuple[Sink, Tr, FrameProtocol]:
        sink, tr = Sink(), Tr()
        proto = FrameProtocol(lambda ch: sink, max_payload_bytes=MAX_PAYLOAD)  # type: ignore[arg-type,return-value]
        proto.connection_made(tr)  # type: ignore[arg-type]
        view, i = memoryview(data), 0
        while view and not proto.closed:
            step = cuts[i % len(cuts)] if cuts else len(view)
            i += 1
            dest = proto.get_buffer(len(view))
            n = max(1, min(len(dest), len(view), step))
            dest[:n] = view[:n]
            proto.buffer_updated(n)  # FrameError is caught inside: the connection is aborted
            view = view[n:]
            assert len(proto._mv) <= fr.MAX_HEADER_BYTES + fr.PREFIX_SIZE + 2 * INITIAL_RECV_BYTES
        proto.connection_lost(None)
        return sink, tr, proto

    return asyncio.run(go())


@FUZZ
@given(st.binary(min_size=fr.PREFIX_SIZE, max_size=64))
def test_parse_prefix_bounds_everything(data: bytes) -> None:
    try:
        p = fr.parse_prefix(data, MAX_PAYLOAD)
    except fr.FrameError:
        return
    assert 0 < p.header_len <= fr.MAX_HEADER_BYTES and 0 <= p.payload_len <= MAX_PAYLOAD
    assert p.kind in (fr.KIND_REQUEST, fr.KIND_RESPONSE)


@FUZZ
@given(st.binary(max_size=300), st.booleans())
def test_decode_header_of_random_bytes(raw: bytes, good_crc: bool) -> None:
    prefix = fr.Prefix(fr.KIND_REQUEST, max(1, len(raw)), 0, 0, fr.crc(raw) if good_crc else 1234)
    try:
        h = fr.decode_header(prefix, raw)
    except fr.FrameError:
        return
    assert all(isinstance(v, int) for v in (h.service, h.method, h.request_id, h.deadline_ms, h.status))
    assert isinstance(h.body, dict) and h.wire_bytes == len(raw)


@FUZZ
@given(_header_items(), st.binary(max_size=64))
def test_decode_frame_of_structured_headers(items: list[Any], payload: bytes) -> None:
    try:
        data = _frame(items, payload)
    except (OverflowError, ValueError, TypeError):
        return  # not encodable: msgpack refuses it before any peer could send it
    if len(data) - fr.PREFIX_SIZE - len(payload) == 0:
        return
    try:
        kind, h, got = fr.decode_frame(data, MAX_PAYLOAD)
    except fr.FrameError:
        return
    assert got == payload and kind == fr.KIND_REQUEST and len(items) >= 7


@FUZZ
@given(st.data())
def test_stream_of_mutated_frames(data: st.DataObject) -> None:
    frames = []
    for i in range(data.draw(st.integers(1, 4))):
        items = [1, 2, i + 1, 0, 0, "", {"path": "/x"}]
        frames.append(bytearray(_frame(items, data.draw(st.binary(max_size=200)))))
    stream = bytearray(b"".join(frames))
    for _ in range(data.draw(st.integers(0, 6))):  # flip, set or drop bytes anywhere
        pos = data.draw(st.integers(0, len(stream) - 1))
        op = data.draw(st.sampled_from(["set", "flip", "drop", "huge"]))
        if op == "set":
            stream[pos] = data.draw(st.integers(0, 255))
        elif op == "flip":
            stream[pos] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "drop":
            del stream[pos]
        elif pos + 4 <= len(stream):
            stream[pos : pos + 4] = struct.pack("<I", data.draw(st.sampled_from([0, 0x7FFFFFFF, 0xFFFFFFFF])))
        if not stream:
            return
    cuts = data.draw(st.lists(st.integers(1, 64), max_size=5))
    sink, tr, proto = _stream(bytes(stream), cuts)
    assert sink.frames <= len(frames) + 1 and sink.biggest <= MAX_PAYLOAD


@FUZZ
@given(st.binary(max_size=2000), st.lists(st.integers(1, 300), max_size=4))
def test_stream_of_random_bytes(data: bytes, cuts: list[int]) -> None:
    sink, tr, _ = _stream(data, cuts)
    assert sink.biggest <= MAX_PAYLOAD


def test_hostile_prefixes_close_only_the_connection() -> None:
    cases = {
        "payload over the limit": _prefix(0, 10, MAX_PAYLOAD + 1, 0, 0),
        "header over the bound": _prefix(0, fr.MAX_HEADER_BYTES + 1, 0, 0, 0),
        "zero header": _prefix(0, 0, 0, 0, 0),
        "bad magic": _prefix(0, 10, 0, 0, 0, magic=0x1234),
        "bad version": _prefix(0, 10, 0, 0, 0, version=9),
        "bad kind": _prefix(7, 10, 0, 0, 0),
    }
    for name, data in cases.items():
        sink, tr, proto = _stream(data + b"\0" * 32, [])
        assert tr.aborted and sink.frames == 0, name


def _corpus() -> list[Path]:
    return sorted(CORPUS.glob("*.bin"))


@pytest.mark.parametrize("path", _corpus(), ids=lambda p: p.name)
def test_corpus_replays(path: Path) -> None:
    data = path.read_bytes()
    for cuts in ([], [1], [7, 13]):
        sink, tr, proto = _stream(data, cuts)
        valid = path.name.startswith("ok-")
        assert tr.aborted != valid, (path.name, cuts)


def test_corpus_is_there() -> None:
    assert len(_corpus()) >= 8
