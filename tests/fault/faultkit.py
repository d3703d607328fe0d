"""Fault-suite helpers: clusters with short leases, a continuous write+read workload."""

from __future__ import annotations

import hashlib
import os
import random
import tempfile
import threading
import time
from dataclasses import dataclass, field

import loomfs
from loomfs.testing import LocalCluster

HEARTBEAT_S = 0.3
LEASE_S = 1.5


def start_cluster(name: str, *, attempts: int = 3, **kw: object) -> LocalCluster:
    """A cluster with short leases. Start-up is retried once in a fresh directory: on this
    shared 2-core machine a service occasionally dies before it logs anything."""
    opts: dict[str, object] = {"heartbeat_interval_s": HEARTBEAT_S, "lease_s": LEASE_S, "gc_delay_s": 1.0,
                               "targets_per_node": 2}
    opts.update(kw)
    for attempt in range(attempts):
        root = tempfile.mkdtemp(prefix=f"loomfs-fault-{name}-")
        c = LocalCluster(root, **opts)  # type: ignore[arg-type]
        try:
            c.start(timeout_s=60)
            return c
        except Exception as exc:
            c.stop()
            dump_logs(c)
            print(f"[fault] cluster start attempt {attempt + 1} failed: {exc}")
            if attempt + 1 == attempts:
                raise
    raise AssertionError("unreachable")


def dump_logs(c: LocalCluster, chars: int = 4000) -> None:
    for s in c.services.values():
        if os.path.exists(s.log_path):
            with open(s.log_path, errors="replace") as f:
                tail = f.read()[-chars:]
            print(f"----- {s.name} log tail -----\n{tail}")


@dataclass
class Stats:
    writes: int = 0
    reads: int = 0
    errors: list[str] = field(default_factory=list)
    max_op_s: float = 0.0  # the longest single operation (the stall a fault caused)
    slow_ops: list[tuple[float, float, str]] = field(default_factory=list)  # (start, duration, what)


class Workload:
    """Writes files of random sizes (several chunks each) and reads back random earlier ones,
    verifying content, until stopped. ``acked`` holds every file whose close() returned."""

    def __init__(self, fs: loomfs.LoomFS, base: str, seed: int, *, size_max: int = 600_000,
                 slow_s: float = 0.5):
        self.fs = fs
        self.base = base
        self.rng = random.Random(seed)
        self.size_max = size_max
        self.slow_s = slow_s
        self.acked: dict[str, str] = {}
        self.stats = Stats()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fault-workload", daemon=True)

    def start(self) -> Workload:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 60.0) -> Stats:
        self._stop.set()
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "workload did not stop"
        return self.stats

    def _timed(self, what: str, fn: object) -> object:
        t0 = time.monotonic()
        try:
            return fn()  # type: ignore[operator]
        finally:
            dt = time.monotonic() - t0
            self.stats.max_op_s = max(self.stats.max_op_s, dt)
            if dt > self.slow_s:
                self.stats.slow_ops.append((t0, dt, what))

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            i += 1
            try:
                if not self.acked or self.rng.random() < 0.6:
                    path = f"{self.base}/f{i:06d}"
                    data = self.rng.randbytes(self.rng.randrange(1, self.size_max))

                    def put(path: str = path, data: bytes = data) -> None:
                        with self.fs.open(path, "wb") as f:
                            f.write(data)

                    self._timed(f"write {path}", put)
                    self.acked[path] = hashlib.sha256(data).hexdigest()
                    self.stats.writes += 1
                else:
                    path = self.rng.choice(sorted(self.acked))
                    got = self._timed(f"read {path}", lambda p=path: self.fs.cat(p))
                    if hashlib.sha256(got).hexdigest() != self.acked[path]:  # type: ignore[arg-type]
                        self.stats.errors.append(f"read {path}: wrong content")
                    self.stats.reads += 1
            except Exception as exc:  # noqa: BLE001 - the test asserts there were none
                self.stats.errors.append(f"op {i}: {type(exc).__name__}: {exc}")
                time.sleep(0.05)

    def verify_all(self) -> list[str]:
        """Read every acknowledged file back; returns the paths that do not match."""
        bad = []
        for path, digest in sorted(self.acked.items()):
            if hashlib.sha256(self.fs.cat(path)).hexdigest() != digest:
                bad.append(path)
        return bad
