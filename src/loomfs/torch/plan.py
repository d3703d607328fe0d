"""The pure parts of shard streaming (no I/O, no torch): which samples each stream reads, the
shuffle buffer, and the DataLoader's delivery order; unit-tested on integers.

A *stream* is one (rank, DataLoader worker): stream ``g = rank * workers + worker`` of
``G = world_size * workers``. With sample counts known (a packed dataset's index), stream ``g``
reads the contiguous range ``[g*N//G, (g+1)*N//G)`` of the epoch's sample order (shards in
the epoch's order, concatenated), so every sample is read by exactly one stream, for any G,
and streams differ by at most one sample. Without counts, whole shards go round-robin.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Piece:
    """Samples ``first .. first+count-1`` of shard ``shard`` (``count`` None: to its end)."""

    shard: int
    first: int
    count: int | None


def shard_order(n_shards: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
    order = list(range(n_shards))
    if shuffle:
        random.Random(f"loomfs-shards:{seed}:{epoch}").shuffle(order)
    return order


def stream_rng(seed: int, epoch: int, stream: int) -> random.Random:
    return random.Random(f"loomfs-samples:{seed}:{epoch}:{stream}")


def stream_range(total: int, stream: int, streams: int) -> tuple[int, int]:
    return stream * total // streams, (stream + 1) * total // streams


def split_counted(order: list[int], counts: list[int], stream: int, streams: int) -> list[Piece]:
    """Stream ``stream``'s pieces: its contiguous share of the shards in ``order``."""
    lo, hi = stream_range(sum(counts), stream, streams)
    out: list[Piece] = []
    base = 0
    for s in order:
        n = counts[s]
        a, b = max(lo, base), min(hi, base + n)
        if a < b:
            out.append(Piece(s, a - base, b - a))
        base += n
        if base >= hi:
            break
    return out


def split_uncounted(order: list[int], stream: int, streams: int) -> list[Piece]:
    """Whole shards, round-robin over the streams."""
    return [Piece(s, 0, None) for k, s in enumerate(order) if k % streams == stream]


def skip_pieces(pieces: list[Piece], n: int) -> list[Piece]:
    """The pieces after the first ``n`` samples (counted pieces only)."""
    out: list[Piece] = []
    for p in pieces:
        assert p.count is not None
        if n >= p.count:
            n -= p.count
            continue
        out.append(Piece(p.shard, p.first + n, p.count - n))
        n = 0
    return out


def locate(pieces: list[Piece], position: int) -> tuple[int, int]:
    """Stream position -> (shard, sample index in that shard)."""
    for p in pieces:
        assert p.count is not None
        if position < p.count:
            return p.shard, p.first + position
        position -= p.count
    raise IndexError(f"stream position {position} is past the stream's end")


class ShuffleBuffer(Generic[T]):
    """The usual streaming shuffle: fill ``size`` items, then each new item swaps out a random
    one; at the end, drain in random order. The k-th output takes the k-th draw of ``rng``, so
    running it on positions replays exactly what it did on samples."""

    def __init__(self, size: int, rng: random.Random):
        if size < 1:
            raise ValueError("a shuffle buffer holds at least one item")
        self.size = size
        self.rng = rng
        self.items: list[T] = []

    @property
    def full(self) -> bool:
        return len(self.items) >= self.size

    def add(self, item: T) -> None:
        self.items.append(item)

    def swap(self, item: T) -> T:
        j = self.rng.randrange(self.size)
        out = self.items[j]
        self.items[j] = item
        return out

    def pop(self) -> T:
        items = self.items
        j = self.rng.randrange(len(items))
        items[j], items[-1] = items[-1], items[j]
        return items.pop()

    def __len__(self) -> int:
        return len(self.items)

    def __repr__(self) -> str:
        return f"ShuffleBuffer({len(self.items)}/{self.size})"


def replay_shuffle(size: int, rng: random.Random, total: int, outputs: int) -> tuple[ShuffleBuffer[int], int]:
    """The buffer (holding stream positions) after ``outputs`` outputs over a stream of
    ``total`` items, and how many items it had pulled."""
    buf: ShuffleBuffer[int] = ShuffleBuffer(size, rng)
    pulled = done = 0
    while done < outputs:
        if pulled < total:
            if buf.full:
                buf.swap(pulled)
                done += 1
            else:
                buf.add(pulled)
            pulled += 1
        elif buf.items:
            buf.pop()
            done += 1
        else:
            raise ValueError(f"a stream of {total} samples has no output {outputs}")
    return buf, pulled


def loader_consumed(lengths: list[int], batch_size: int, drop_last: bool,
                    samples_seen: int) -> tuple[list[int], int]:
    """Samples each worker had yielded when a DataLoader (in order) delivered ``samples_seen``
    samples, and the worker whose batch was due next: batches come round-robin from the
    workers, an exhausted worker drops out, and a worker's last batch may be short (dropped
    with ``drop_last``)."""
    consumed = [0] * len(lengths)
    left = samples_seen
    nxt = 0
    rnd = 0
    while left > 0:
        progressed = False
        for w, n in enumerate(lengths):
            take = min(batch_size, n - rnd * batch_size)
            if take <= 0 or (drop_last and take < batch_size):
                continue
            progressed = True
            if take > left:
                raise ValueError(f"{samples_seen} samples is not at a batch boundary "
                                 f"(worker {w}'s batch {rnd} holds {take})")
            consumed[w] += take
            left -= take
            if left == 0:
                nxt = (w + 1) % len(lengths)
                break
        if not progressed:
            raise ValueError(f"{samples_seen} samples is more than this rank's epoch delivers")
        rnd += 1
    return consumed, nxt
