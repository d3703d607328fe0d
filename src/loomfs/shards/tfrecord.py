"""TFRecord files: each record is

    uint64 length (little endian) | uint32 masked CRC32C of those 8 bytes | data | uint32 masked CRC32C of data

(the framing TensorFlow's ``tf.data.TFRecordDataset`` reads). The packer stores a sample as a
``tf.train.Example`` whose ``__key__`` feature is its key and whose other features are its
fields; files written elsewhere may hold anything (``parse_examples=False`` gives raw bytes).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import crc32c

from loomfs.shards.errors import ShardCorrupt, ShardTruncated
from loomfs.shards.example import ExampleError, FeatureValue, decode_example, encode_example
from loomfs.shards.reader import ByteReader, Sink

KEY_FEATURE = "__key__"
_MASK_DELTA = 0xA282EAD8
_HEADER = struct.Struct("<QI")
_CRC = struct.Struct("<I")
RECORD_MAX_BYTES = 1 << 31  # a bound before allocating (the length is CRC-checked first)


def masked_crc32c(data: bytes | bytearray | memoryview) -> int:
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame(data: bytes | bytearray | memoryview) -> list[bytes]:
    """The pieces of one framed record (written one after another)."""
    length = struct.pack("<Q", len(data))
    return [length, _CRC.pack(masked_crc32c(length)), bytes(data), _CRC.pack(masked_crc32c(data))]


class TFRecordWriter:
    """Writes framed records; ``write_sample`` stores a tf.train.Example with ``__key__``."""

    suffix = ".tfrecord"

    def __init__(self, f: Sink):
        self._f = f
        self.offset = 0
        self.samples = 0

    def write(self, data: bytes | bytearray | memoryview) -> tuple[int, int]:
        """Append one record; returns its (offset, length) including the framing."""
        start = self.offset
        for piece in frame(data):
            self._f.write(piece)
            self.offset += len(piece)
        self.samples += 1
        return start, self.offset - start

    def write_sample(self, key: str, fields: dict[str, Any]) -> tuple[int, int]:
        if KEY_FEATURE in fields:
            raise ValueError(f"sample {key!r} has a field named {KEY_FEATURE!r}")
        return self.write(encode_example({KEY_FEATURE: key.encode(), **fields}))

    def close(self) -> None:
        """Nothing to finish (TFRecord has no trailer); the caller closes the file."""

    def __repr__(self) -> str:
        return f"TFRecordWriter(records={self.samples} offset={self.offset})"


def iter_records(r: ByteReader, *, verify: bool = True) -> Iterator[tuple[bytes, int, int]]:
    """Records as ``(data, offset, length)``; a CRC mismatch or a cut-off record raises with
    the record's offset."""
    shard = r.shard
    while not r.at_end():
        start = r.offset
        head = r.read_exact(12, "TFRecord length header")
        length, length_crc = _HEADER.unpack(head)
        if verify and masked_crc32c(head[:8]) != length_crc:
            raise ShardCorrupt(shard, start, "TFRecord length CRC mismatch (corrupt, or not a TFRecord file)")
        if length > RECORD_MAX_BYTES:
            raise ShardCorrupt(shard, start, f"TFRecord of {length} bytes is over the {RECORD_MAX_BYTES}-byte bound")
        try:
            data = r.read_exact(length, "TFRecord data")
            (data_crc,) = _CRC.unpack(r.read_exact(4, "TFRecord data CRC"))
        except ShardTruncated as exc:
            raise ShardTruncated(shard, start, f"TFRecord of {length} bytes is cut off at byte {r.offset} "
                                 "(the shard is truncated)") from exc
        if verify and masked_crc32c(data) != data_crc:
            raise ShardCorrupt(shard, start, f"TFRecord data CRC mismatch in the record of {length} bytes")
        yield data, start, r.offset - start


def example_sample(shard: str, offset: int, data: bytes, default_key: str) -> tuple[str, dict[str, FeatureValue]]:
    """A record's tf.train.Example as ``(key, fields)``; the key is its ``__key__`` feature
    when it has one."""
    try:
        fields = decode_example(data)
    except ExampleError as exc:
        raise ShardCorrupt(shard, offset, f"record is not a tf.train.Example ({exc}); "
                           "read it with parse_examples=False") from None
    key_value = fields.pop(KEY_FEATURE, None)
    if isinstance(key_value, bytes):
        return key_value.decode("utf-8", "surrogateescape"), fields
    return default_key, fields


def iter_tfrecord_samples(r: ByteReader, first_index: int, stem: str, *,
                          parse_examples: bool = True) -> Iterator[tuple[str, dict[str, Any], int, int]]:
    """Samples as ``(key, fields, offset, length)``: a parsed Example, or ``{"data": bytes}``
    (key ``STEM/INDEX``) with ``parse_examples=False``."""
    for i, (data, start, length) in enumerate(iter_records(r), first_index):
        default_key = f"{stem}/{i}"
        if parse_examples:
            key, fields = example_sample(r.shard, start, data, default_key)
            yield key, fields, start, length
        else:
            yield default_key, {"data": data}, start, length
