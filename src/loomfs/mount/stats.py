"""What the kernel sends the mount: request counts, read request sizes, reads in flight.

Read as JSON from the virtual attribute ``user.loomfs.stats`` of the mount's root directory
(``getfattr -n user.loomfs.stats --only-values MOUNTPOINT``): ``loomfs bench --mount`` prints
the read request size from it, and a test checks that the bdi read-ahead took effect (FUSE
sends 128 KiB reads when it did not). No I/O here.
"""

from __future__ import annotations

import json
from collections import Counter

STATS_XATTR = b"user.loomfs.stats"


class MountStats:
    __slots__ = ("requests", "read_sizes", "reads_in_flight", "reads_in_flight_max", "read_bytes",
                 "read_prefetched")

    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()  # handler name -> calls
        self.read_sizes: Counter[int] = Counter()  # READ request size (bytes) -> requests
        self.reads_in_flight = 0
        self.reads_in_flight_max = 0
        self.read_bytes = 0
        self.read_prefetched = 0  # READs answered from the mount's own prefetch (no wait)

    def read_started(self, size: int) -> None:
        self.read_sizes[size] += 1
        self.reads_in_flight += 1
        if self.reads_in_flight > self.reads_in_flight_max:
            self.reads_in_flight_max = self.reads_in_flight

    def read_done(self, n: int) -> None:
        self.reads_in_flight -= 1
        self.read_bytes += n

    def as_json(self) -> bytes:
        return json.dumps({
            "requests": dict(self.requests),
            "read_sizes": {str(k): v for k, v in sorted(self.read_sizes.items())},
            "read_bytes": self.read_bytes,
            "reads_in_flight_max": self.reads_in_flight_max,
            "read_prefetched": self.read_prefetched,
        }, sort_keys=True).encode()
