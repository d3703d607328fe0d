"""Cluster capacity as every view shows it (``loomfs top``, the dashboard, mgmtd's /metrics,
``admin targets``): each disk counted once, spares named as such. Pure functions of a
routing snapshot.

Targets are directories, and several of them often share one disk (a local cluster puts all
of them on one): summing their ``capacity_bytes`` (each the whole file system's size, from
``statvfs``) counted that disk once per target. Targets are grouped by disk: by (host, the
disk id storage reports: ``TargetInfo.disk_id``, the ``st_dev`` of the target directory);
a target that reports none (an older storage node) by (host, capacity): on one host, targets
whose file systems have exactly the same size are taken to be on one disk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loomfs.wire.types import TargetState


@dataclass(frozen=True, slots=True)
class Capacity:
    used_bytes: int  # chunk bytes on all targets (every replica counts)
    capacity_bytes: int  # each disk once
    disks: int
    targets: int

    @property
    def free_bytes(self) -> int:
        return max(0, self.capacity_bytes - self.used_bytes)


def disk_key(target: Any, hosts: dict[int, str]) -> tuple[str, str]:
    """Which disk a target lives on: (host, disk id) or, without one, (host, 'size=N')."""
    host = hosts.get(target.node_id, f"node{target.node_id}")
    disk_id = target.disk_id
    return (host, f"dev={disk_id}") if disk_id else (host, f"size={target.capacity_bytes}")


def cluster_capacity(routing: Any) -> Capacity:
    hosts = {n.node_id: n.host for n in routing.nodes}
    disks: dict[tuple[str, str], int] = {}
    for t in routing.targets:
        if not t.capacity_bytes:
            continue  # not reported yet
        key = disk_key(t, hosts)
        disks[key] = max(disks.get(key, 0), int(t.capacity_bytes))
    return Capacity(used_bytes=sum(int(t.used_bytes) for t in routing.targets),
                    capacity_bytes=sum(disks.values()), disks=len(disks), targets=len(routing.targets))


def target_state_name(target: Any) -> str:
    """``spare`` for a serving target in no chain (it holds nothing a client reads), else the
    state's name (``serving``, ``syncing``, ``offline``, ...)."""
    try:
        name = TargetState(target.state).name.lower()
    except ValueError:
        name = str(target.state)
    if not target.chain_id and target.state == TargetState.SERVING:
        return "spare"
    return name


def target_blank_note(target: Any) -> str:
    """"" unless the target is *blank* (routing's ``TargetInfo.blank``: it came back with another
    disk, mgmtd.diskident): what that means for its chain, in a few words."""
    if not getattr(target, "blank", False):
        return ""
    if target.state == TargetState.LASTSRV:  # the marker of a chain whose newest copy is lost
        return "blank: disk replaced, the chain's newest copy is lost (admin chain accept-loss)"
    if target.state == TargetState.SYNCING:
        return "blank: disk replaced, resyncing"
    return "blank: disk replaced, waiting to resync"
