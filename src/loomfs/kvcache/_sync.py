"""``KVCache``: the blocking twin of ``AsyncKVCache``, over a ``loomfs.connect()`` client.

Every call runs on the client's loop thread (``LoomFS.run``); the background task (touches,
eviction, compaction) runs there too. Create the cache after ``fork`` (like the client).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from loomfs.kvcache._config import KVConfig, KVStats
from loomfs.kvcache._core import AsyncKVCache

if TYPE_CHECKING:
    from loomfs.client.sync import LoomFS


class KVCache:
    """Put/get of KV blocks keyed by bytes under ``prefix`` of a LoomFS cluster.

    ``capacity_bytes``: live value bytes kept (least recently used beyond it are evicted);
    ``ttl_s``: a value not put or touched (a hit touches) for this long is gone (0 = never).
    Other options: ``KVConfig`` fields (``inline_value_max_bytes``, ``segment_bytes``, ...).
    """

    def __init__(self, fs: LoomFS, prefix: str, capacity_bytes: int = 1 << 40, ttl_s: float = 0.0, *,
                 clock: Callable[[], float] | None = None, **options: Any):
        fields = {f.name for f in dataclasses.fields(KVConfig)}
        bad = set(options) - fields
        if bad:
            raise TypeError(f"KVCache: unknown option(s) {', '.join(sorted(bad))}")
        config = KVConfig(capacity_bytes=capacity_bytes, ttl_s=ttl_s, **options)
        self.fs = fs
        self.prefix = prefix
        self._config = config
        self._clock = clock
        self._aio = self._open()

    def _open(self) -> AsyncKVCache:
        fs, prefix, config, clock = self.fs, self.prefix, self._config, self._clock

        async def make() -> AsyncKVCache:
            if clock is None:
                return await AsyncKVCache(fs.client, prefix, config).open()
            return await AsyncKVCache(fs.client, prefix, config, clock=clock).open()

        return fs.run(make())

    @property
    def aio(self) -> AsyncKVCache:
        """The async cache on the client's loop; after ``fork`` the client is a new one, and so
        is this (a new writer with its own segments)."""
        if self._aio.client is not self.fs.client and not self._aio.closed:
            self._aio.closed = True  # the parent's: its loop is not running here
            self._aio = self._open()
        return self._aio

    @property
    def stats(self) -> KVStats:
        return self.aio.stats

    @property
    def config(self) -> KVConfig:
        return self.aio.config

    def put(self, key: bytes, value: Any) -> None:
        self.fs.run(self.aio.put(key, value))

    def put_many(self, items: Iterable[tuple[bytes, Any]] | dict[bytes, Any]) -> None:
        self.fs.run(self.aio.put_many(items))

    def get(self, key: bytes, into: Any = None) -> Any:
        return self.fs.run(self.aio.get(key, into))

    def get_many(self, keys: Sequence[bytes], into: Sequence[Any] | None = None) -> list[Any]:
        return self.fs.run(self.aio.get_many(keys, into))

    def contains(self, key: bytes) -> bool:
        return self.fs.run(self.aio.contains_many([key]))[0]

    def contains_many(self, keys: Sequence[bytes]) -> list[bool]:
        return self.fs.run(self.aio.contains_many(keys))

    def delete(self, key: bytes) -> bool:
        return self.fs.run(self.aio.delete(key))

    def delete_many(self, keys: Sequence[bytes]) -> list[bool]:
        return self.fs.run(self.aio.delete_many(keys))

    def touch(self, key: bytes) -> bool:
        return self.fs.run(self.aio.touch(key))

    def touch_many(self, keys: Sequence[bytes]) -> list[bool]:
        return self.fs.run(self.aio.touch_many(keys))

    def maintain(self) -> dict[str, int]:
        """One round of the background work now (touches, sealing, eviction, compaction)."""
        return self.fs.run(self.aio.maintain())

    def evict_now(self) -> dict[str, int]:
        """One eviction and compaction pass now, lease or not (tests, tools)."""
        from loomfs.kvcache import _evict

        return self.fs.run(_evict.evict_once(self.aio))

    def close(self) -> None:
        if not self.aio.closed and not self.fs.closed:
            self.fs.run(self.aio.close())

    def __enter__(self) -> KVCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"KVCache({self.aio!r})"
