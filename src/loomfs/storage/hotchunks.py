"""Which chunk reads a storage server serves from its page cache, with ``os.sendfile``.

Storage reads big chunks with O_DIRECT (``engine.file_io``): a chunk read once (a big file
streamed by a training job) would only evict useful pages, and on this kind of VM filling fresh
page-cache pages costs more CPU than the O_DIRECT read (``bench.sendcost``: 0.44 vs 0.29
CPU-s/GiB for the sender). A chunk read again soon after (a KV-cache block many requests share)
is worth keeping in memory: the disk (~1 GB/s here) is slower than the network, and a resident
chunk goes page cache -> socket with no copy through user space.

``HotChunks`` is a bounded LRU of recently read ranges (a whole chunk, or a block-aligned part
of one: a 2 MiB KV value of a 4 MiB chunk) with their read counts. ``plan`` says, per read:
``DIRECT`` (O_DIRECT as before: the first ``PROMOTE_AFTER_READS`` reads), ``FILL`` (read that
often already: a buffered read on the executor fills the page cache and answers from the
buffer) or ``SENDFILE`` (and resident: a ``FileRegion`` reply).
Filling costs more than an O_DIRECT read here (fresh page-cache pages; measured: storage 1.07
vs 0.50 CPU-s/GiB for a pass that fills), so a chunk read only twice (a scan read back once)
never pays it. Residency is checked, not assumed (the kernel may have evicted the pages): a
non-blocking read (``RWF_NOWAIT``) of the range's first, middle and last byte, so a
``sendfile`` on the event loop does not wait for the disk.
"""

from __future__ import annotations

import enum
import os
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

from loomfs.storage.engine.file_io import in_page_cache

HOT_CHUNKS_MAX = 4096  # ranges remembered per storage process (counts only: ~0.5 MiB of dict)
PROMOTE_AFTER_READS = 2  # reads of a chunk served with O_DIRECT before it is kept in the page cache
HOT_CHUNKS_ENV = "LOOMFS_HOT_CHUNKS"  # overrides HOT_CHUNKS_MAX; "0": every read as before (A/B)
SENDFILE_MIN_BYTES = 256 << 10  # smaller reads go through the page cache already (file_io)


class Plan(enum.Enum):
    DIRECT = "direct"
    FILL = "fill"
    SENDFILE = "sendfile"


class HotChunks:
    """A bounded LRU of chunks read whole; counts what each plan was used for."""

    def __init__(self, entries_max: int | None = None, promote_after_reads: int = PROMOTE_AFTER_READS):
        if entries_max is None:
            entries_max = int(os.environ.get(HOT_CHUNKS_ENV, HOT_CHUNKS_MAX))
        self.entries_max = entries_max
        self.promote_after_reads = promote_after_reads
        self._reads: OrderedDict[Hashable, int] = OrderedDict()
        self.counts = {p: 0 for p in Plan}

    def note(self, key: Hashable) -> int:
        """Record a whole-chunk read of ``key``; how many reads of it were remembered before."""
        if self.entries_max <= 0:
            return 0
        before = self._reads.get(key, 0)
        self._reads[key] = before + 1
        self._reads.move_to_end(key)
        if len(self._reads) > self.entries_max:
            self._reads.popitem(last=False)
        return before

    def forget(self, key: Hashable) -> None:
        self._reads.pop(key, None)

    def plan(self, key: Hashable, fd: int, length: int, offset: int = 0) -> Plan:
        """How to serve a read of ``key`` (``length`` bytes at ``offset`` of ``fd``)."""
        if self.note(key) < self.promote_after_reads:
            p = Plan.DIRECT
        else:
            p = Plan.SENDFILE if resident(fd, length, offset) else Plan.FILL
        self.counts[p] += 1
        return p

    def __repr__(self) -> str:
        return (f"HotChunks({len(self._reads)}/{self.entries_max} direct={self.counts[Plan.DIRECT]} "
                f"fill={self.counts[Plan.FILL]} sendfile={self.counts[Plan.SENDFILE]})")


def resident(fd: int, length: int, offset: int = 0) -> bool:
    """Whether ``fd``'s first, middle and last byte of ``[offset, offset + length)`` are in the
    page cache (a read that would wait for the disk fails with EAGAIN under RWF_NOWAIT); False
    where the kernel or Python lacks RWF_NOWAIT (``file_io.in_page_cache`` says None)."""
    return length > 0 and in_page_cache(fd, offset, length) is True


def open_region(engine: Any, key: Any) -> tuple[int, int, int] | None:
    """(fd, length, crc) of ``key``'s committed version from ``engine.open_region`` (the
    caller owns the fd); None for no committed file (or an engine without the hook)."""
    hook = getattr(engine, "open_region", None)
    if hook is None:
        return None
    region: tuple[int, int, int] | None = hook(key)
    return region
