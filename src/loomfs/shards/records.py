"""Plain length-prefixed record files (``.rec``): each record is ``uint64 length (little
endian) | data``, with no checksum and no header (the storage layer checksums every chunk).
A record is one sample ``{"data": bytes}`` keyed ``STEM/INDEX``."""

from __future__ import annotations

import struct
from collections.abc import Iterator

from loomfs.shards.errors import ShardCorrupt, ShardTruncated
from loomfs.shards.reader import ByteReader, Sink

_LEN = struct.Struct("<Q")
RECORD_MAX_BYTES = 1 << 31


class RecordWriter:
    suffix = ".rec"

    def __init__(self, f: Sink):
        self._f = f
        self.offset = 0
        self.samples = 0

    def write(self, data: bytes | bytearray | memoryview) -> tuple[int, int]:
        start = self.offset
        self._f.write(_LEN.pack(len(data)))
        self._f.write(data)
        self.offset += _LEN.size + len(data)
        self.samples += 1
        return start, self.offset - start

    def write_sample(self, key: str, fields: dict[str, bytes]) -> tuple[int, int]:
        """One field only (record files carry no names): the sample's single value."""
        if len(fields) != 1:
            raise ValueError(f"sample {key!r}: a record file holds one value per sample, got {sorted(fields)}")
        return self.write(next(iter(fields.values())))

    def close(self) -> None:
        """Nothing to finish."""

    def __repr__(self) -> str:
        return f"RecordWriter(records={self.samples} offset={self.offset})"


def iter_record_samples(r: ByteReader, first_index: int, stem: str) -> Iterator[tuple[str, dict[str, bytes], int, int]]:
    for i in range(first_index, 1 << 62):
        if r.at_end():
            return
        start = r.offset
        (length,) = _LEN.unpack(r.read_exact(8, "record length"))
        if length > RECORD_MAX_BYTES:
            raise ShardCorrupt(r.shard, start, f"record length {length} is over the {RECORD_MAX_BYTES}-byte "
                               "bound (not a record file, or corrupt)")
        try:
            data = r.read_exact(length, "record data")
        except ShardTruncated as exc:
            raise ShardTruncated(r.shard, start, f"record of {length} bytes is cut off at byte {r.offset} "
                                 "(the shard is truncated)") from exc
        yield f"{stem}/{i}", {"data": data}, start, r.offset - start
