"""Retry dedupe: request tags on the chunk (every replica, persisted) and the head's in-flight
cache.

A client write or truncate carries a tag (client id, request id) that stays the same across
its retries. Each chunk version keeps, for each of the last ``TAGS_MAX`` clients that changed
it, that client's last request (the engine persists the tags with the version), so a retry
that reaches a new head after failover is recognised there too: a tag on the committed version
(or an older request id of the same client: the client updates a chunk one request at a time,
in id order) is answered at once, a tag on the pending version pushes that version down the
chain. ``TagCache`` joins a retry to the
same request still running at the head.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import TypeVar

from loomfs.errors import InvalidArgument
from loomfs.storage import chain, planted
from loomfs.storage.engine.types import TAGS_MAX, ChunkState, ChunkTag
from loomfs.wire.message import Message
from loomfs.wire.storage import RequestTag

M = TypeVar("M", bound=Message)


class TagCache:
    """Bounded LRU of (client_id, request_id) -> result future, for write dedupe at the head.
    Failed requests are forgotten so a retry applies them; in-progress ones are awaited."""

    def __init__(self, max_entries: int = 8192):
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[int, int], asyncio.Future[Message]] = OrderedDict()
        self.hits = 0

    async def run(self, tag: RequestTag | None, fn: Callable[[], Awaitable[M]]) -> M:
        if tag is None or (tag.client_id == 0 and tag.request_id == 0):
            return await fn()
        k = (tag.client_id, tag.request_id)
        known = self._entries.get(k)
        if known is not None:
            self.hits += 1
            self._entries.move_to_end(k)
            return await asyncio.shield(known)  # type: ignore[arg-type]
        fut: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._entries[k] = fut
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        try:
            result = await fn()
        except BaseException as exc:
            if self._entries.get(k) is fut:
                del self._entries[k]
            if isinstance(exc, asyncio.CancelledError):
                fut.cancel()
            else:
                fut.set_exception(exc)
                fut.exception()  # waiters get it; nobody else needs to
            raise
        fut.set_result(result)
        return result

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"TagCache({len(self._entries)}/{self.max_entries} hits={self.hits})"


def tag_seen(st: ChunkState | None, tag: RequestTag | None) -> chain.TagSeen:
    """Whether a client request was already applied to the chunk (the tags are persisted with
    every version on every replica). A chunk keeps, per client, the last request that changed
    it; a client has one update of a chunk in flight at a time and numbers its requests in
    order, so a request id at or below the one on the chunk was applied or superseded — a
    retry or a late duplicate, never applied again."""
    if st is None or tag is None or (tag.client_id == 0 and tag.request_id == 0) or planted.on("no_chunk_tags"):
        return chain.TagSeen.NO
    cid, rid = tag.client_id, tag.request_id
    if st.has_pending:
        p = next((t for t in st.pending_tags if t.client_id == cid), None)
        if p is not None and p.version == st.pending_ver and p.request_id == rid:
            return chain.TagSeen.PENDING
        if p is not None and p.request_id > rid:
            return chain.TagSeen.COMMITTED  # older than what the pending version carries
    c = next((t for t in st.tags if t.client_id == cid), None)
    if c is not None and c.request_id >= rid:
        return chain.TagSeen.COMMITTED
    return chain.TagSeen.NO


def applied_version(st: ChunkState | None, tag: RequestTag | None) -> int | None:
    """The version a request already applied to the chunk made (its tag on the committed
    version), None if the chunk does not say (superseded by a later request of its client)."""
    if st is None or tag is None or (tag.client_id == 0 and tag.request_id == 0):
        return None
    c = next((t for t in st.tags if t.client_id == tag.client_id), None)
    return c.version if c is not None and c.request_id == tag.request_id else None


def next_tags(st: ChunkState | None, tag: RequestTag | None, version: int) -> tuple[ChunkTag, ...] | None:
    """The tags version ``version`` carries: the committed ones with this client's replaced by
    this request (the last ``TAGS_MAX`` clients that changed the chunk)."""
    if tag is None or (tag.client_id == 0 and tag.request_id == 0):
        return None
    old = tuple(t for t in st.tags if t.client_id != tag.client_id) if st is not None else ()
    return (*old, ChunkTag(tag.client_id, tag.request_id, version))[-TAGS_MAX:]


def pack_tags(tags: tuple[ChunkTag, ...]) -> list[int]:
    return [x for t in tags for x in (t.client_id, t.request_id, t.version)]


def unpack_tags(flat: list[int]) -> tuple[ChunkTag, ...]:
    if len(flat) % 3 or len(flat) > 3 * TAGS_MAX:
        raise InvalidArgument(f"bad request tag list ({len(flat)} numbers)")
    return tuple(ChunkTag(flat[i], flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3))
