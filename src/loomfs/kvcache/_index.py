"""A get's index entries straight from meta's READ_MANY reply.

``AsyncClient.read_many`` answers any files: per item it copies the content out of the reply
(``bytes``), checks its CRC32C and builds a list of results, after settling this client's
pending creates of those paths. A KV-cache get needs none of the generality: its entries are
small inline files it never creates lazily, and each is decoded once, straight from the
reply's payload, into an ``Entry`` that copies what it keeps. ``read_entries`` sends the
READ_MANY requests itself (``MetaClient.call_full``: the same failover over meta servers),
checks each item's CRC32C against meta's and hands the item's bytes (a view of the reply's
payload, valid during the call) to ``decode``; measured at ~5-9 us a value of client CPU on
the from-meta path before (docs/kvcache.md).

Each item's result is ``decode``'s, or the ``OSError`` the single READ would raise
(``FileNotFoundError`` for a missing entry, ``ChecksumError`` for bytes failing meta's CRC).
An entry stored in chunks (not written by this code) is read the general way. A reply that
answers a prefix of its request is followed by a request for the rest, as the client's batch
calls do; a malformed reply raises ``ProtocolError``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import crc32c

from loomfs.errors import ChecksumError, ProtocolError, from_status
from loomfs.kvcache._jobs import run_all
from loomfs.wire import meta_batch as wb
from loomfs.wire.status import Status

if TYPE_CHECKING:
    from loomfs.client.core import AsyncClient

T = TypeVar("T")

# paths per READ_MANY request (a get_many of more is several requests in flight at once)
REQUEST_ITEMS = 1024
REQUEST_PATH_BYTES = wb.REQUEST_PATH_BYTES_MAX // 2


def _groups(paths: Sequence[str]) -> list[tuple[int, int]]:
    """``[start, end)`` ranges of ``paths`` within the request bounds."""
    out: list[tuple[int, int]] = []
    start = used = 0
    for i, p in enumerate(paths):
        n = 4 * len(p) + 5  # UTF-8: at most 4 bytes a character
        if i > start and (i - start >= REQUEST_ITEMS or used + n > REQUEST_PATH_BYTES):
            out.append((start, i))
            start, used = i, 0
        used += n
    if start < len(paths):
        out.append((start, len(paths)))
    return out


async def read_entries(client: AsyncClient, paths: Sequence[str],
                       decode: Callable[[memoryview], T]) -> list[T | OSError]:
    """``decode(bytes of paths[i])`` or item i's ``OSError``, for every path (normalised
    absolute paths of files)."""
    meta = getattr(client, "meta", None)
    if meta is None or getattr(meta, "rpc", None) is None:  # no RPC client (a test double)
        raw = await client.read_many(paths)
        return [r if isinstance(r, OSError) else decode(memoryview(r)) for r in raw]
    out: list[Any] = [None] * len(paths)
    chunked: list[int] = []
    groups = _groups(paths)
    jobs = [_request(meta, paths, start, end, decode, out, chunked) for start, end in groups]
    await run_all(jobs)  # one that fails cancels the others and waits for them
    if chunked:  # entries stored in chunks: not written by this code; the general read
        raw = await client.read_many([paths[i] for i in chunked])
        for i, r in zip(chunked, raw, strict=True):
            out[i] = r if isinstance(r, OSError) else decode(memoryview(r))
    return out


async def _request(meta: Any, paths: Sequence[str], start: int, end: int, decode: Callable[[memoryview], Any],
                   out: list[Any], chunked: list[int]) -> None:
    crc = crc32c.crc32c
    while start < end:
        rsp = await meta.call_full(wb.READ_MANY, wb.PathsReq(paths=list(paths[start:end])))
        body: wb.ReadManyRsp = rsp.body
        count = body.count
        if not 1 <= count <= end - start:
            raise ProtocolError(f"read_many reply answers {count} of {end - start} items")
        lengths, crcs = body.lengths, body.crcs
        if len(lengths) != count or len(crcs) != count:
            raise ProtocolError(f"read_many reply: {count} items, {len(lengths)} lengths, {len(crcs)} CRCs")
        payload: memoryview = rsp.payload
        pos = 0
        for k in range(count):
            n = lengths[k]
            if n < 0:
                continue
            item = payload[pos : pos + n]
            pos += n
            if len(item) != n:
                raise ProtocolError("read_many reply: lengths pass the payload")
            if crc(item) != crcs[k]:
                out[start + k] = ChecksumError("inline content fails its CRC32C", path=paths[start + k])
            else:
                out[start + k] = decode(item)
        if pos != len(payload):
            raise ProtocolError("read_many reply: payload longer than its items")
        for e in body.errors:
            if not 0 <= e.index < count or e.status == Status.OK or lengths[e.index] >= 0:
                raise ProtocolError(f"read_many reply: bad error item {e.index}")
            out[start + e.index] = from_status(e.status, e.message, path=paths[start + e.index])
        for c in body.chunked:
            if not 0 <= c.index < count or lengths[c.index] >= 0:
                raise ProtocolError(f"read_many reply: bad chunked item {c.index}")
            chunked.append(start + c.index)
        for k in range(count):
            if out[start + k] is None and start + k not in chunked:
                raise ProtocolError(f"read_many reply: item {k} not answered")
        start += count
