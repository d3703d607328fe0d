"""Reading samples out of shards: streaming from a byte range, and one sample at an offset."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from loomfs.shards.errors import ShardCorrupt, ShardError, ShardTruncated
from loomfs.shards.formats import RawSample, iter_samples
from loomfs.shards.reader import BLOCK_BYTES, ByteReader, file_blocks
from loomfs.shards.store import Store


def iter_shard(store: Store, path: str, fmt: str, *, start: int = 0, end: int | None = None,
               first_index: int = 0, parse_examples: bool = True,
               blocks: Iterable[bytes] | None = None) -> Iterator[RawSample]:
    """Samples of ``path`` in ``[start, end)`` (``end`` None: to its end). ``blocks``: the
    bytes of that range when someone else (a prefetcher) reads them."""
    name = store.url(path)
    if blocks is not None:
        yield from iter_samples(fmt, ByteReader(name, blocks, start), first_index=first_index,
                                parse_examples=parse_examples)
        return
    with store.open_read(path) as f:
        r = ByteReader(name, file_blocks(f, start, end, BLOCK_BYTES), start)
        yield from iter_samples(fmt, r, first_index=first_index, parse_examples=parse_examples)


def check_count(shard: str, got: int, want: int, offset: int) -> None:
    if got != want:
        raise ShardError(shard, offset, f"holds {got} samples where its index says {want} "
                         "(truncated or rewritten since it was indexed)")


def sample_from_bytes(shard: str, fmt: str, data: bytes, offset: int, index: int,
                      parse_examples: bool = True) -> RawSample:
    """The one sample in ``data`` (the bytes at ``offset`` of the shard, from its index)."""
    found = list(iter_samples(fmt, ByteReader(shard, [data], offset), first_index=index,
                              parse_examples=parse_examples))
    if len(found) != 1:
        raise ShardCorrupt(shard, offset, f"the index's range of sample {index} holds {len(found)} samples")
    return found[0]


def read_ranges(store: Store, path: str, ranges: list[tuple[int, int]]) -> list[bytes]:
    """The bytes of each ``(offset, length)`` of one file (opened once, read in offset order)."""
    out: list[Any] = [b""] * len(ranges)
    with store.open_read(path) as f:
        for i in sorted(range(len(ranges)), key=lambda j: ranges[j][0]):
            off, length = ranges[i]
            f.seek(off)
            data = f.read(length)
            if len(data) != length:
                raise ShardTruncated(store.url(path), off + len(data),
                                 f"file ends inside the sample at byte {off} ({length} bytes per the index)")
            out[i] = data
    return out
