"""Conditional rewrites of index entries: the background writers (LRU touches, compaction's
moves) never overwrite an entry that changed since they looked at it.

A put writes its entry blindly (the last put of a key wins), but a touch or a move is derived
from the entry it read: written blindly, it would undo a put or a delete made meanwhile, or
point a key back at a segment compaction removed. So each rewrite here is: the entry's
attributes (STAT_MANY), then its bytes (READ_MANY; read after the attributes, so bytes newer
than them only make the rename below fail), ``decide(current) -> new entry or None``, the new
entry written to ``<prefix>/tmp/<writer>-<n>`` (PUT_MANY) and renamed over the entry with
``expect=(inode, size, mtime_ns)`` of what was read (meta checks it in the rename's
transaction: EBUSY when the entry changed). On EBUSY the entry is looked at again and
``decide`` asked again, ``ATTEMPTS`` times in all. A temp file left by a process that died
between the put and the rename is unlinked by the eviction pass (``sweep_tmp``).

Cost: three meta round trips a batch plus one rename a rewritten entry (in flight together,
``RENAMES_INFLIGHT``); only background work comes here, never a put or a get.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from loomfs.kvcache import _entry as E
from loomfs.kvcache._index import read_entries

if TYPE_CHECKING:
    from loomfs.kvcache._core import AsyncKVCache

logger = logging.getLogger(__name__)

ATTEMPTS = 3
RENAMES_INFLIGHT = 64
_seq = itertools.count(1)

Decide = Callable[[E.Entry | None], E.Entry | None]


def _decode(data: memoryview) -> E.Entry | None:
    try:
        return E.decode(data)
    except E.EntryError:
        return None


async def rewrite(cache: AsyncKVCache, keys: Sequence[bytes], decide: Decide
                  ) -> tuple[list[E.Entry | None], list[E.Entry | None]]:
    """Rewrite the entries of ``keys`` (distinct) as ``decide(current)`` says, each only if
    unchanged since read. Returns (per key the entry written or None, per key the entry last
    seen: None when gone or malformed)."""
    written: list[E.Entry | None] = [None] * len(keys)
    seen: list[E.Entry | None] = [None] * len(keys)
    todo = list(range(len(keys)))
    for _ in range(ATTEMPTS):
        if not todo:
            break
        todo = await _attempt(cache, keys, todo, decide, written, seen)
    return written, seen


async def _attempt(cache: AsyncKVCache, keys: Sequence[bytes], todo: list[int], decide: Decide,
                   written: list[E.Entry | None], seen: list[E.Entry | None]) -> list[int]:
    """One look and write of ``todo``; the indexes whose entry changed under the write."""
    c = cache.client
    paths = [cache._path(keys[i]) for i in todo]
    attrs = await c.stat_many(paths)  # before the bytes: see the module docstring
    raw = await read_entries(c, paths, _decode)
    writes: list[tuple[int, str, E.Entry, tuple[int, int, int]]] = []
    for i, path, a, r in zip(todo, paths, attrs, raw, strict=True):
        cur = r if isinstance(r, E.Entry) and r.key == keys[i] else None
        seen[i] = cur
        if cur is None or isinstance(a, OSError):
            continue
        new = decide(cur)
        if new is not None:
            writes.append((i, path, new, (a.inode, a.size, a.mtime_ns)))
    if not writes:
        return []
    tmps = [f"{cache.tmp_dir}/{cache.writer_id:x}-{next(_seq)}" for _ in writes]
    errors = await c.put_many([(t, E.encode(new)) for t, (_, _, new, _) in zip(tmps, writes, strict=True)])
    slots = asyncio.Semaphore(RENAMES_INFLIGHT)
    again: list[int] = []
    leftover: list[str] = []

    async def one(tmp: str, i: int, path: str, new: E.Entry, expect: tuple[int, int, int]) -> None:
        async with slots:
            try:
                await c.rename(tmp, path, expect=expect)
            except OSError as exc:
                leftover.append(tmp)
                cache.icache.forget(keys[i])
                if exc.errno == errno.EBUSY:
                    again.append(i)
                else:
                    logger.info("kvcache %s: rewrite of %s failed: %s", cache.prefix, keys[i].hex()[:32], exc)
                return
            written[i] = new
            cache.icache.learn(new)

    jobs = []
    for tmp, (i, path, new, expect), err in zip(tmps, writes, errors, strict=True):
        if err is not None:
            logger.info("kvcache %s: rewrite of %s failed: %s", cache.prefix, keys[i].hex()[:32], err)
            leftover.append(tmp)
        else:
            jobs.append(one(tmp, i, path, new, expect))
    await asyncio.gather(*jobs)
    if leftover:
        await c.rm_many(leftover)  # errors: the sweep removes what is left
    return sorted(again)


async def sweep_tmp(cache: AsyncKVCache, age_s: float) -> int:
    """Unlink temp entries older than ``age_s`` (left by a process that died mid-rewrite)."""
    c = cache.client
    now = time.time()
    old: list[str] = []
    try:
        async for page in c.readdir_pages(cache.tmp_dir, with_attrs=True):
            old += [f"{cache.tmp_dir}/{d.name}" for d in page
                    if d.attr is not None and now - d.attr.ctime_ns / 1e9 > age_s]
    except FileNotFoundError:
        return 0
    if not old:
        return 0
    return sum(err is None for err in await c.rm_many(old))
