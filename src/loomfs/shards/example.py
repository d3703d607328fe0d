"""A minimal ``tf.train.Example`` codec (protobuf wire format written out by hand, so reading
and writing TFRecord shards needs neither TensorFlow nor protobuf).

    Example  { Features features = 1; }
    Features { map<string, Feature> feature = 1; }
    Feature  { oneof { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; } }

Decoded values: a ``bytes_list`` of one value is ``bytes`` (several: a list of bytes), an
``int64_list`` is a ``list[int]``, a ``float_list`` a ``list[float]``.
"""

from __future__ import annotations

import struct
from typing import Any

FeatureValue = bytes | list[bytes] | list[int] | list[float]


class ExampleError(ValueError):
    """The bytes are not a valid tf.train.Example."""


def _varint(n: int) -> bytes:
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _feature(value: Any) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview | str):
        raw = value.encode() if isinstance(value, str) else bytes(value)
        return _field(1, _field(1, raw))
    if isinstance(value, int):
        value = [value]
    if isinstance(value, float):
        value = [value]
    items = list(value)
    if all(isinstance(v, bytes | bytearray | str) for v in items):
        body = b"".join(_field(1, v.encode() if isinstance(v, str) else bytes(v)) for v in items)
        return _field(1, body)
    if all(isinstance(v, int) for v in items):
        return _field(3, _field(1, b"".join(_varint(v) for v in items)) if items else b"")
    if all(isinstance(v, int | float) for v in items):
        return _field(2, _field(1, struct.pack(f"<{len(items)}f", *items)) if items else b"")
    raise TypeError(f"cannot store {type(value).__name__} in a tf.train.Feature")


def encode_example(features: dict[str, Any]) -> bytes:
    """``{name: bytes | str | int | float | list of one kind}`` -> serialized tf.train.Example."""
    body = b"".join(_field(1, _field(1, name.encode()) + _field(2, _feature(v)))
                    for name, v in features.items())
    return _field(1, body)


def _read_varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if pos >= end or shift > 63:
            raise ExampleError("malformed varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes, pos: int, end: int) -> list[tuple[int, int, Any]]:
    """(field number, wire type, value) triples of one message: ints for varints, (start,
    stop) spans for length-delimited fields and fixed-width ones."""
    out: list[tuple[int, int, Any]] = []
    while pos < end:
        tag, pos = _read_varint(buf, pos, end)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _read_varint(buf, pos, end)
            out.append((number, wire, value))
        elif wire == 2:
            n, pos = _read_varint(buf, pos, end)
            if pos + n > end:
                raise ExampleError("field runs past the end of its message")
            out.append((number, wire, (pos, pos + n)))
            pos += n
        elif wire in (1, 5):
            n = 8 if wire == 1 else 4
            if pos + n > end:
                raise ExampleError("field runs past the end of its message")
            out.append((number, wire, (pos, pos + n)))
            pos += n
        else:
            raise ExampleError(f"unsupported wire type {wire}")
    return out


def _decode_feature(buf: bytes, start: int, end: int) -> FeatureValue:
    for number, wire, span in _fields(buf, start, end):
        if wire != 2:
            continue
        s, e = span
        values = _fields(buf, s, e)
        if number == 1:
            items = [buf[a:b] for n, w, (a, b) in values if n == 1 and w == 2]
            return items[0] if len(items) == 1 else items
        if number == 3:
            ints: list[int] = []
            for n, w, v in values:
                if n != 1:
                    continue
                if w == 0:
                    ints.append(v - (1 << 64) if v >= 1 << 63 else v)
                elif w == 2:
                    p, stop = v
                    while p < stop:
                        x, p = _read_varint(buf, p, stop)
                        ints.append(x - (1 << 64) if x >= 1 << 63 else x)
            return ints
        if number == 2:
            floats: list[float] = []
            for n, w, (a, b) in values:
                if n == 1 and w in (2, 5):
                    floats.extend(struct.unpack(f"<{(b - a) // 4}f", buf[a:a + (b - a) // 4 * 4]))
            return floats
    return []


def decode_example(data: bytes) -> dict[str, FeatureValue]:
    """Serialized tf.train.Example -> ``{name: value}`` (raises ``ExampleError``)."""
    out: dict[str, FeatureValue] = {}
    for number, wire, span in _fields(data, 0, len(data)):
        if number != 1 or wire != 2:
            continue
        for n, w, entry in _fields(data, *span):
            if n != 1 or w != 2:
                continue
            name: str | None = None
            value: FeatureValue = []
            for fn, fw, span2 in _fields(data, *entry):
                if fw != 2:
                    continue
                a, b = span2
                if fn == 1:
                    name = data[a:b].decode("utf-8", "surrogateescape")
                elif fn == 2:
                    value = _decode_feature(data, a, b)
            if name is None:
                raise ExampleError("feature map entry without a name")
            out[name] = value
    return out
