"""``KVConfig`` (the cache's options, checked) and ``KVStats`` (its counters)."""

from __future__ import annotations

import dataclasses

from loomfs.errors import InvalidArgument


@dataclasses.dataclass
class KVStats:
    hits: int = 0
    misses: int = 0
    expired: int = 0
    corrupt: int = 0  # values whose bytes failed their CRC (returned as misses)
    read_errors: int = 0  # value reads that failed after retries (returned as misses)
    puts: int = 0
    put_bytes: int = 0
    get_bytes: int = 0
    touches_written: int = 0
    touches_dropped: int = 0  # pending touches of keys put, deleted or changed since their hit
    evicted: int = 0
    unreadable: int = 0  # index items an eviction pass could not read (a stray directory, bad CRC)
    segments_removed: int = 0
    values_moved: int = 0


@dataclasses.dataclass(frozen=True)
class KVConfig:
    capacity_bytes: int = 1 << 40
    ttl_s: float = 0.0  # 0 = no expiry
    inline_value_max_bytes: int = 0  # values up to this size live in their index entry (meta)
    segment_bytes: int = 256 << 20
    # chunk size of the segments (0, or a prefix whose layout has another chunk size than the
    # default: the prefix's layout): a whole-chunk run of 8 x 2 MiB values is
    # one request instead of four (per GiB of hot 2 MiB gets: client + storage 0.95-1.05 CPU-s vs
    # 1.18-1.24 with 4 MiB chunks, docs/kvcache.md); smaller values are read in runs of <= 1 MiB
    segment_chunk_bytes: int = 16 << 20
    segment_roll_s: float = 60.0
    background_interval_s: float = 2.0  # 0 = no background task (call maintain() yourself)
    evict: bool = True  # this cache object may run eviction and compaction (under the lease)
    evict_interval_s: float = 30.0  # at most one eviction/compaction pass (an index scan) this often
    low_water: float = 0.9  # eviction stops at this fraction of capacity
    compact_live_ratio: float = 0.5  # sealed segments with less live data are compacted
    # a hit rewrites its entry's time (LRU, and the TTL starts again) once the entry is this old
    # (or half the TTL, if shorter): recency at this granularity, one meta write per key at most
    touch_after_s: float = 30.0
    segment_abandon_s: float = 600.0  # an unsealed (.open) segment this old: its writer is gone
    index_cache_s: float = 0.0  # reuse an index entry seen here for this long (0 = ask meta every get)

    def check(self) -> None:
        if self.capacity_bytes <= 0 or self.ttl_s < 0 or self.segment_bytes <= 0 or self.segment_roll_s <= 0:
            raise InvalidArgument("kvcache: capacity_bytes and segment sizes must be > 0, ttl_s >= 0")
        cs = self.segment_chunk_bytes
        if cs < 0 or (cs and (cs & (cs - 1) or not 64 << 10 <= cs <= 64 << 20)):
            raise InvalidArgument("kvcache: segment_chunk_bytes is 0 or a power of two from 64 KiB to 64 MiB")
        if self.segment_abandon_s <= self.segment_roll_s:
            raise InvalidArgument("kvcache: segment_abandon_s must exceed segment_roll_s (a live writer's "
                                  "open segment would look abandoned)")
        if not 0 < self.low_water <= 1 or not 0 <= self.compact_live_ratio <= 1:
            raise InvalidArgument("kvcache: low_water in (0, 1], compact_live_ratio in [0, 1]")
