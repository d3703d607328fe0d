"""Shared by the datasets: sources to stores, rank/world detection, compact path tables."""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterable, Sequence
from typing import Any

from loomfs.shards.store import Store, location

Source = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


def resolve(source: Source, address: str | None) -> tuple[Store, str | list[str]]:
    """One store for a path, URL, glob or list of them (a list must not mix stores)."""
    if isinstance(source, str | os.PathLike):
        return location(source, address)
    items = [location(s, address) for s in source]
    if not items:
        raise ValueError("an empty list of paths")
    store = items[0][0]
    if any(s != store for s, _ in items):
        raise ValueError("all paths of one dataset must be in one place (one cluster, or local)")
    return store, [p for _, p in items]


def dist_rank_world() -> tuple[int, int] | None:
    """(rank, world size) from ``torch.distributed`` when a process group is up."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch built without distributed
        return None
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def check_rank(rank: int | None, world_size: int | None) -> None:
    if (rank is None) != (world_size is None):
        raise ValueError("give both rank and world_size, or neither")
    if rank is not None and world_size is not None and not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")


class PathTable:
    """Many paths in two flat buffers (one bytes object, one array of ends) instead of a list of
    ``str``: pickles fast to spawned workers, and forked workers reading it do not touch
    per-object refcounts, so the pages stay shared (the DataLoader copy-on-read problem)."""

    def __init__(self, paths: Iterable[str]):
        blob = bytearray()
        ends = array("Q")
        for p in paths:
            blob += p.encode("utf-8", "surrogateescape")
            ends.append(len(blob))
        self._blob = bytes(blob)
        self._ends = ends

    def __len__(self) -> int:
        return len(self._ends)

    def __getitem__(self, i: int) -> str:
        if i < 0:
            i += len(self._ends)
        start = self._ends[i - 1] if i > 0 else 0
        return self._blob[start:self._ends[i]].decode("utf-8", "surrogateescape")

    def __iter__(self) -> Any:
        return (self[i] for i in range(len(self)))

    def __repr__(self) -> str:
        return f"PathTable({len(self)} paths, {len(self._blob)} bytes)"
