"""LMCache storage plugin: LMCache's KV chunks in a LoomFS ``KVCache``.

LMCache loads it from its config::

    storage_plugins: ["loomfs"]
    extra_config:
      storage_plugin.loomfs.module_path: loomfs.kvcache.lmcache
      storage_plugin.loomfs.class_name: LoomFSBackend
      loomfs.cluster: "127.0.0.1:8000"     # or a local cluster directory
      loomfs.prefix: /lmcache
      loomfs.capacity_bytes: 107374182400
      loomfs.ttl_s: 0
      loomfs.index_cache_s: 1.0

With ``lmcache`` installed the class derives from its ``StorageBackendInterface``; without
it, from the double in ``_lmcache_iface`` (the same methods and signatures). A put stores
each MemoryObj's tensor (dtype and shape kept) under ``key.to_string()``; a get reads it
straight into a MemoryObj allocated from LMCache's CPU backend (``local_cpu_backend.allocate``)
with the shape and dtype the index entry names: one chunk read into LMCache's own buffer.
Puts run on one background thread (ordered), each MemoryObj held (``ref_count_up``) until
stored. ``pin`` touches the key (LRU keeps it longer) but cannot stop another process's
eviction or the TTL; all chunks are allocated with one memory format (``loomfs.memory_format``,
default KV_2LTD).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import torch

from loomfs.kvcache._sync import KVCache
from loomfs.kvcache._values import ValueInfo

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from loomfs.kvcache._lmcache_iface import StorageBackendInterface as _Base
    LMCACHE_INSTALLED = False
else:
    try:
        from lmcache.v1.storage_backend.abstract_backend import StorageBackendInterface as _Base

        LMCACHE_INSTALLED = True
    except Exception as exc:  # not installed, or installed without its CUDA dependencies
        logger.debug("lmcache not importable (%s): using the interface double", exc)
        from loomfs.kvcache._lmcache_iface import StorageBackendInterface as _Base

        LMCACHE_INSTALLED = False


def key_bytes(key: Any) -> bytes:
    to_string = getattr(key, "to_string", None)
    return (to_string() if callable(to_string) else str(key)).encode()


def _memory_format(name: str) -> Any:
    if LMCACHE_INSTALLED:
        from lmcache.v1.memory_management import MemoryFormat
    else:
        from loomfs.kvcache._lmcache_iface import MemoryFormat
    return MemoryFormat[name]


class LoomFSBackend(_Base):
    def __init__(self, config: Any = None, dst_device: str = "cpu", metadata: Any = None,
                 local_cpu_backend: Any = None, loop: asyncio.AbstractEventLoop | None = None, *,
                 fs: Any = None):
        super().__init__(dst_device=dst_device)
        extra: dict[str, Any] = dict(getattr(config, "extra_config", None) or {})
        self._own_fs = fs is None
        if fs is None:
            import loomfs

            fs = loomfs.connect(extra.get("loomfs.cluster"))
        self.fs = fs
        self.kv = KVCache(fs, str(extra.get("loomfs.prefix", "/lmcache")),
                          capacity_bytes=int(extra.get("loomfs.capacity_bytes", 1 << 40)),
                          ttl_s=float(extra.get("loomfs.ttl_s", 0.0)),
                          index_cache_s=float(extra.get("loomfs.index_cache_s", 1.0)))
        self.fmt = _memory_format(str(extra.get("loomfs.memory_format", "KV_2LTD")))
        self.local_cpu_backend = local_cpu_backend
        self.metadata = metadata
        self.loop = loop
        self._lock = threading.Lock()
        self._putting: dict[bytes, int] = {}
        self._pinned: set[bytes] = set()
        self._puts = ThreadPoolExecutor(1, thread_name_prefix="loomfs-lmcache-put")

    # --- puts ---------------------------------------------------------------------------

    def exists_in_put_tasks(self, key: Any) -> bool:
        with self._lock:
            return key_bytes(key) in self._putting

    def batched_submit_put_task(self, keys: Sequence[Any], objs: list[Any], transfer_spec: Any = None,
                                on_complete_callback: Callable[[Any], None] | None = None) -> list[Future[Any]] | None:
        ks = [key_bytes(k) for k in keys]
        with self._lock:
            for k in ks:
                self._putting[k] = self._putting.get(k, 0) + 1
        for o in objs:
            o.ref_count_up()
        return [self._puts.submit(self._put, list(keys), ks, list(objs), on_complete_callback)]

    def _put(self, keys: list[Any], ks: list[bytes], objs: list[Any], done: Callable[[Any], None] | None) -> None:
        try:
            self.kv.put_many([(k, o.tensor) for k, o in zip(ks, objs, strict=True)])
        finally:
            for o in objs:
                o.ref_count_down()
            with self._lock:
                for k in ks:
                    n = self._putting.get(k, 0) - 1
                    if n > 0:
                        self._putting[k] = n
                    else:
                        self._putting.pop(k, None)
        if done is not None:
            for key in keys:
                try:
                    done(key)
                except Exception as exc:
                    logger.warning("lmcache put callback for %s: %s", key, exc)

    async def async_batched_submit_put_task(self, keys: Sequence[Any], objs: list[Any], transfer_spec: Any = None,
                                            on_complete_callback: Callable[[Any], None] | None = None) -> None:
        futures = self.batched_submit_put_task(keys, objs, transfer_spec, on_complete_callback) or []
        for f in futures:
            await asyncio.wrap_future(f)

    # --- lookups and gets -----------------------------------------------------------------

    def contains(self, key: Any, pin: bool = False) -> bool:
        return self.batched_contains([key], pin) == 1

    def batched_contains(self, keys: list[Any], pin: bool = False) -> int:
        """How many leading keys are stored (LMCache's prefix hit count), one meta round trip."""
        found = self.kv.contains_many([key_bytes(k) for k in keys])
        hits = next((i for i, f in enumerate(found) if not f), len(found))
        if pin:
            for k in keys[:hits]:
                self.pin(k)
        return hits

    async def batched_async_contains(self, lookup_id: str, keys: list[Any], pin: bool = False) -> int:
        return await asyncio.to_thread(self.batched_contains, keys, pin)

    def get_blocking(self, key: Any) -> Any:
        return self.batched_get_blocking([key])[0]

    def batched_get_blocking(self, keys: list[Any]) -> list[Any]:
        """MemoryObjs of ``keys`` (None for misses), each read straight into its allocation."""
        allocated: list[Any] = [None] * len(keys)

        def allocator(i: int) -> Callable[[ValueInfo], Any]:
            def alloc(info: ValueInfo) -> Any:
                if info.kind != "torch" or self.local_cpu_backend is None:
                    return None
                if allocated[i] is not None:  # asked again (a stale entry was re-read)
                    allocated[i].ref_count_down()
                obj = self.local_cpu_backend.allocate(torch.Size(info.shape), getattr(torch, info.dtype), self.fmt)
                allocated[i] = obj
                return None if obj is None else obj.tensor
            return alloc

        try:
            got = self.kv.get_many([key_bytes(k) for k in keys], into=[allocator(i) for i in range(len(keys))])
        except BaseException:  # a group failed part-way: no read runs now; give back every allocation
            for obj in allocated:
                if obj is not None:
                    obj.ref_count_down()
            raise
        out: list[Any] = []
        for i, g in enumerate(got):
            obj = allocated[i]
            if g is None:
                if obj is not None:
                    obj.ref_count_down()
                out.append(None)
            elif obj is not None:
                out.append(obj)
            else:  # not a tensor (not put by this plugin), or LMCache's allocator was full: a miss
                logger.warning("lmcache get of %s: no MemoryObj to read it into (a miss)", keys[i])
                out.append(None)
        return out

    def get_non_blocking(self, key: Any, location: str | None = None) -> Future[Any] | None:
        return self._puts.submit(self.get_blocking, key)

    async def batched_get_non_blocking(self, lookup_id: str, keys: list[Any], transfer_spec: Any = None) -> list[Any]:
        objs = await asyncio.to_thread(self.batched_get_blocking, keys)
        hits = next((i for i, o in enumerate(objs) if o is None), len(objs))
        for o in objs[hits:]:
            if o is not None:
                o.ref_count_down()
        return objs[:hits]

    # --- the rest -------------------------------------------------------------------------

    def pin(self, key: Any) -> bool:
        k = key_bytes(key)
        if not self.kv.touch(k):
            return False
        with self._lock:
            self._pinned.add(k)
        return True

    def unpin(self, key: Any) -> bool:
        with self._lock:
            was = key_bytes(key) in self._pinned
            self._pinned.discard(key_bytes(key))
        return was

    def remove(self, key: Any, force: bool = True) -> bool:
        return self.kv.delete(key_bytes(key))

    def batched_remove(self, keys: list[Any], force: bool = True) -> int:
        return sum(self.kv.delete_many([key_bytes(k) for k in keys]))

    def get_allocator_backend(self) -> Any:
        return self.local_cpu_backend

    def touch_cache(self) -> None:
        return  # hits already touch their entries (LRU), in the background

    def close(self) -> None:
        self._puts.shutdown(wait=True)
        self.kv.close()
        if self._own_fs:
            self.fs.close()

    def __repr__(self) -> str:
        return f"LoomFSBackend({self.kv!r} lmcache={'installed' if LMCACHE_INSTALLED else 'double'})"
