"""One storage target: its engine plus per-chunk locks that serialise updates."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from loomfs.storage.engine.base import ChunkEngine, ChunkKey


def target_id_for(node_id: int, index: int) -> int:
    """Target ids: node N serving targets [dir0, dir1, ...] has ids N*1000 + i + 1."""
    return node_id * 1000 + index + 1


@dataclass(slots=True)
class _LockEntry:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


class ChunkLocks:
    """A lock per chunk, held only while someone uses it (the table stays small)."""

    def __init__(self) -> None:
        self._locks: dict[ChunkKey, _LockEntry] = {}

    @asynccontextmanager
    async def hold(self, key: ChunkKey) -> AsyncIterator[None]:
        entry = self._locks.get(key)
        if entry is None:
            entry = self._locks[key] = _LockEntry()
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if entry.users == 0:
                del self._locks[key]

    def __len__(self) -> int:
        return len(self._locks)

    def __repr__(self) -> str:
        return f"ChunkLocks(held={len(self._locks)})"


class StorageTarget:
    def __init__(self, target_id: int, engine: ChunkEngine, path: str = ""):
        self.target_id = target_id
        self.engine = engine
        self.path = path
        self.locks = ChunkLocks()

    def __repr__(self) -> str:
        return f"StorageTarget({self.target_id} {self.engine!r} locks={len(self.locks)})"
