"""What processes cost while a benchmark phase runs: CPU seconds (user + system) and bytes
sent to the disk (``/proc/PID/io`` ``write_bytes``: page-cache pages dirtied and O_DIRECT
writes, charged to the process that wrote them), read from ``/proc`` before and after.

The checkpoint benchmark uses it to say what each side of a comparison wrote to the disk (a
local ``FileSystemWriter`` writes one copy, a LoomFS cluster one per replica) and what the
storage processes spent per GiB saved.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Cost:
    cpu_s: float = 0.0
    write_bytes: int = 0

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.cpu_s + other.cpu_s, self.write_bytes + other.write_bytes)

    def __sub__(self, other: Cost) -> Cost:
        return Cost(self.cpu_s - other.cpu_s, self.write_bytes - other.write_bytes)


def cost_of(pid: int | None = None) -> Cost:
    """CPU seconds and disk write bytes of ``pid`` (default: this process) so far; zeros for
    a process that is gone or whose ``/proc`` entries cannot be read."""
    where = f"/proc/{pid if pid is not None else 'self'}"
    try:
        fields = Path(f"{where}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        io = dict(line.split(": ", 1) for line in Path(f"{where}/io").read_text().splitlines() if ": " in line)
        return Cost(cpu, int(io.get("write_bytes", "0")))
    except (OSError, ValueError, IndexError):
        return Cost()


def storage_pids(where: str) -> list[int]:
    """Pids of the running storage services of the local cluster in directory ``where``
    (empty when ``where`` is no local cluster directory, e.g. an mgmtd address)."""
    if not os.path.isdir(where):
        return []
    try:
        from loomfs.testing.cluster import LocalCluster

        cluster = LocalCluster.from_dir(where)
    except Exception:  # not a cluster directory: nothing to measure
        return []
    return [s.pid for s in cluster.services.values() if s.kind == "storage" and s.alive()]


class Meter:
    """The cost of ``pids`` between ``start()`` and ``stop()`` (``None`` in the list: this
    process)."""

    def __init__(self, pids: list[int | None]):
        self.pids = pids
        self._t0 = Cost()
        self.cost = Cost()

    def _now(self) -> Cost:
        out = Cost()
        for pid in self.pids:
            out = out + cost_of(pid)
        return out

    def start(self) -> None:
        self._t0 = self._now()

    def stop(self) -> Cost:
        self.cost = self._now() - self._t0
        return self.cost
