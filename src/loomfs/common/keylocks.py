"""A lock per key (a chunk, a file), created on first use and dropped when nobody holds it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Hashable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass(slots=True)
class _LockEntry:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


class KeyLocks(Generic[K]):
    """A lock per key, held only while someone uses it (the table stays small)."""

    def __init__(self) -> None:
        self._locks: dict[K, _LockEntry] = {}

    @asynccontextmanager
    async def hold(self, key: K) -> AsyncIterator[None]:
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

    def busy(self, key: K) -> bool:
        """Whether someone holds (or waits for) ``key``'s lock."""
        return key in self._locks

    def users(self, key: K) -> int:
        """How many hold or wait for ``key``'s lock."""
        entry = self._locks.get(key)
        return 0 if entry is None else entry.users

    def __len__(self) -> int:
        return len(self._locks)

    def __repr__(self) -> str:
        return f"KeyLocks(held={len(self._locks)})"
