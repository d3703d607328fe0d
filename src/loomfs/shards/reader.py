"""``ByteReader``: the parsers' view of one shard's bytes, fed by blocks from any source.

The format parsers (tar, TFRecord, records) only call ``read_exact``/``skip``/``at_end`` and
read ``offset`` (the absolute byte offset in the shard, for error messages and the index);
where the blocks come from (a local file, a LoomFS file, a prefetching thread) is not
their business.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import BinaryIO, Protocol

from loomfs.shards.errors import ShardTruncated

BLOCK_BYTES = 4 << 20


class Sink(Protocol):
    """Where writers put bytes (a binary file, or a buffer in front of one)."""

    def write(self, data: bytes | bytearray | memoryview, /) -> int | None: ...


def file_blocks(f: BinaryIO, start: int = 0, end: int | None = None,
                block_bytes: int = BLOCK_BYTES) -> Iterator[bytes]:
    """Blocks of ``f`` from byte ``start`` up to ``end`` (None: to EOF); a short file just
    ends early (the parser reports the truncation with the offset)."""
    if start:
        f.seek(start)
    pos = start
    while end is None or pos < end:
        want = block_bytes if end is None else min(block_bytes, end - pos)
        data = f.read(want)
        if not data:
            return
        pos += len(data)
        yield data


class ByteReader:
    """Sequential reads over an iterator of blocks, with the shard's absolute offsets."""

    def __init__(self, shard: str, blocks: Iterable[bytes], start_offset: int = 0):
        self.shard = shard
        self._blocks = iter(blocks)
        self._buf = b""
        self._pos = 0
        self._base = start_offset  # shard offset of self._buf[0]
        self._eof = False

    @property
    def offset(self) -> int:
        return self._base + self._pos

    def _more(self) -> bool:
        """Load the next non-empty block behind what is left; False at the end."""
        if self._eof:
            return False
        for block in self._blocks:
            if block:
                rest = self._buf[self._pos:]
                self._base += self._pos
                self._buf = rest + block if rest else block
                self._pos = 0
                return True
        self._eof = True
        return False

    def at_end(self) -> bool:
        """True when no byte is left (loads the next block to find out)."""
        while self._pos >= len(self._buf):
            if not self._more():
                return True
        return False

    def read_exact(self, n: int, what: str) -> bytes:
        """``n`` bytes, or ``ShardTruncated`` naming ``what`` was being read and where."""
        end = self._pos + n
        if end <= len(self._buf):
            out = self._buf[self._pos:end]
            self._pos = end
            return out
        start = self.offset
        parts = [self._buf[self._pos:]]
        got = len(parts[0])
        self._base += len(self._buf)
        self._buf, self._pos = b"", 0
        while got < n:
            if not self._more():
                raise ShardTruncated(self.shard, start, f"{what}: needs {n} bytes, only {got} left "
                                     "(the shard is truncated)")
            take = min(n - got, len(self._buf))
            parts.append(self._buf[:take])
            self._pos = take
            got += take
        return b"".join(parts)

    def skip(self, n: int, what: str) -> None:
        start = self.offset
        left = n
        while left > 0:
            avail = len(self._buf) - self._pos
            if avail <= 0:
                if not self._more():
                    raise ShardTruncated(self.shard, start, f"{what}: needs {n} bytes, only {n - left} left "
                                         "(the shard is truncated)")
                continue
            step = min(avail, left)
            self._pos += step
            left -= step

    def __repr__(self) -> str:
        return f"ByteReader({self.shard!r} offset={self.offset})"
