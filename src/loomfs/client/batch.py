"""Batch calls on the async core: many paths in one meta round trip (``loomfs.wire.meta_batch``).

Each call answers per item, in the order given: the value, or the ``OSError`` (with its
errno and path) that the single call would raise. An error of the whole call (no meta server
reachable, a malformed reply) raises.

* ``read_many``: READ_MANY answers inline files with their bytes, whose CRC32C is checked
  here, and files in chunks with their attributes; those are read from storage as soon as
  the reply naming them arrives, with at most ``READ_CHUNKS_INFLIGHT`` chunk reads in flight
  for the whole batch. A directory is EISDIR.
* ``stat_many``, ``rm_many``: STAT_MANY, UNLINK_MANY (``rm_many`` never removes a directory:
  EISDIR).
* ``put_many``: contents up to the client's ``inline_put_max_bytes`` (what a "w" open
  buffers to create the file with its bytes) go in PUT_MANY requests; bigger
  ones, and those meta answers as fallbacks (too big for their file's inline limit, or
  inline files off there), are written by ``AsyncClient.pipe``, at most ``PIPES_INFLIGHT``
  at once. A path named twice is written once, with its last content: the end state of
  writing them in order.

Requests hold at most ``BATCH_ITEMS_MAX`` paths and ``REQUEST_PATH_BYTES_MAX`` of path text
(PUT_MANY: and ``PUT_MANY_DATA_BYTES_MAX`` of content); a bigger batch is split. A reply
that answers a prefix of its request is followed by a request for the rest. Read requests
run up to ``REQUESTS_INFLIGHT`` at once; write requests one after another.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import crc32c

from loomfs.client import paths as P
from loomfs.client.layout import split_range
from loomfs.client.readgrants import ReadGrants
from loomfs.errors import (
    ChecksumError,
    ConnectionFailed,
    LoomError,
    ProtocolError,
    from_status,
)
from loomfs.net.rpc import Response
from loomfs.wire import meta_batch as wb
from loomfs.wire.message import Message, Method
from loomfs.wire.status import Status
from loomfs.wire.types import Attr

if TYPE_CHECKING:
    from loomfs.client.core import AsyncClient

logger = logging.getLogger(__name__)

REQUESTS_INFLIGHT = 4  # read-only batch requests in flight per call
READ_CHUNKS_INFLIGHT = 64  # chunk reads in flight per read_many
PIPES_INFLIGHT = 16  # whole-file writes in flight per put_many

_Item = tuple[int, str]  # (index in the caller's list, normalised path)


async def read_many(client: AsyncClient, paths: Sequence[str]) -> list[bytes | OSError]:
    """The contents of many files; a failed item is its ``OSError``."""
    out: list[Any] = [None] * len(paths)
    todo = _normalised(paths, out)
    chunk_slots = asyncio.Semaphore(READ_CHUNKS_INFLIGHT)
    request_slots = asyncio.Semaphore(REQUESTS_INFLIGHT)

    async def request(items: list[_Item], tg: asyncio.TaskGroup) -> None:
        async with request_slots:
            while items:
                rsp = await _call(client, wb.READ_MANY, wb.PathsReq(paths=[p for _, p in items]))
                body: wb.ReadManyRsp = rsp.body
                count = _answered(body.count, len(items), wb.READ_MANY)
                if len(body.lengths) != count or len(body.crcs) != count:
                    raise ProtocolError(f"read_many reply: {count} items, {len(body.lengths)} lengths")
                payload, pos = rsp.payload, 0
                for k in range(count):
                    length = body.lengths[k]
                    if length < 0:
                        continue
                    if pos + length > len(payload):
                        raise ProtocolError("read_many reply: lengths pass the payload")
                    i, path = items[k]
                    data = bytes(payload[pos : pos + length])
                    pos += length
                    if crc32c.crc32c(data) != body.crcs[k]:
                        out[i] = ChecksumError("inline content fails its CRC32C", path=path)
                    else:
                        out[i] = data
                if pos != len(payload):
                    raise ProtocolError("read_many reply: payload longer than its items")
                _item_errors(body.errors, items, count, out)
                kept = getattr(client.storage, "read_grants", None)
                for c, grant in zip(body.chunked, body.read_grants, strict=False):
                    if grant and c.attr is not None and isinstance(kept, ReadGrants):
                        kept.note(c.attr.inode, grant)  # its chunk READs need no READ_GRANTS first
                for c in body.chunked:
                    if not 0 <= c.index < count or c.attr is None:
                        raise ProtocolError(f"read_many reply: bad chunked item {c.index}")
                    i, path = items[c.index]
                    tg.create_task(_read_chunked(client, c.attr, path, i, out, chunk_slots))
                items = items[count:]

    async with _tasks() as tg:
        for group in _requests(todo):
            tg.create_task(request(group, tg))
    return _finished(paths, out)


async def _read_chunked(
    client: AsyncClient, attr: Attr, path: str, i: int, out: list[Any], slots: asyncio.Semaphore
) -> None:
    """Read a file in chunks (``attr.size`` bytes) into ``out[i]``; an error is its item's."""
    layout = attr.layout
    if attr.size == 0:
        out[i] = b""
        return
    if layout is None or not layout.chains:
        out[i] = LoomError("file has no layout", path=path)
        return
    buf = bytearray(attr.size)
    view = memoryview(buf)
    if layout.ec_k:  # erasure-coded: stripes, not chunks (loomfs.client.ec_file)
        from loomfs.client.ec_file import read_ec

        try:
            await read_ec(client.storage, layout, attr.inode, 0, view, client.pool)  # type: ignore[arg-type]
        except OSError as exc:
            out[i] = exc if exc.filename else LoomError(str(exc), errno=exc.errno, path=path)
            return
        out[i] = bytes(buf)
        return

    async def piece(index: int, offset: int, length: int, at: int) -> None:
        async with slots:
            await client.storage.read_chunk(layout, attr.inode, index, offset, length, view[at : at + length])

    pieces = [piece(p.index, p.offset, p.length, p.buffer_offset) for p in split_range(layout, 0, attr.size)]
    results = await asyncio.gather(*pieces, return_exceptions=True)
    failed = next((r for r in results if isinstance(r, BaseException)), None)
    if failed is None:
        out[i] = bytes(buf)
    elif isinstance(failed, OSError):
        out[i] = failed if failed.filename else LoomError(str(failed), errno=failed.errno, path=path)
    else:
        raise failed


async def stat_many(
    client: AsyncClient, paths: Sequence[str], *, follow_symlinks: bool = True
) -> list[Attr | OSError]:
    """Attributes of many paths (``lstat`` each with ``follow_symlinks=False``)."""
    out: list[Any] = [None] * len(paths)
    todo = _normalised(paths, out)
    request_slots = asyncio.Semaphore(REQUESTS_INFLIGHT)

    async def request(items: list[_Item]) -> None:
        async with request_slots:
            while items:
                req = wb.PathsReq(paths=[p for _, p in items], follow_symlinks=follow_symlinks, compact=True)
                body: wb.StatManyRsp = (await _call(client, wb.STAT_MANY, req)).body
                count = _answered(body.count, len(items), wb.STAT_MANY)
                if body.rows or not body.attrs:  # compact (a server that predates it sends attrs)
                    if len(body.rows) != count:
                        raise ProtocolError(f"stat_many reply: {count} items, {len(body.rows)} rows")
                    layouts = body.layouts
                    try:
                        for k, row in enumerate(body.rows):
                            if row is not None:
                                out[items[k][0]] = wb.attr_of_row(row, layouts)
                    except ValueError as exc:
                        raise ProtocolError(f"stat_many reply: {exc}") from None
                else:
                    if len(body.attrs) != count:
                        raise ProtocolError(f"stat_many reply: {count} items, {len(body.attrs)} attributes")
                    for k in range(count):
                        if body.attrs[k] is not None:
                            out[items[k][0]] = body.attrs[k]
                _item_errors(body.errors, items, count, out)
                items = items[count:]

    async with _tasks() as tg:
        for group in _requests(todo):
            tg.create_task(request(group))
    return _finished(paths, out)


async def rm_many(client: AsyncClient, paths: Sequence[str]) -> list[OSError | None]:
    """Unlink many files and symlinks, in order; per item None or its ``OSError``."""
    out: list[OSError | None] = [None] * len(paths)
    for items in _requests(_normalised(paths, out)):
        while items:  # every item is answered (None: removed) or the call raises
            req = wb.PathsReq(paths=[p for _, p in items])
            body: wb.UnlinkManyRsp = (await _call(client, wb.UNLINK_MANY, req)).body
            count = _answered(body.count, len(items), wb.UNLINK_MANY)
            _item_errors(body.errors, items, count, out)
            items = items[count:]
    return out


async def put_many(
    client: AsyncClient, items: dict[str, bytes] | Sequence[tuple[str, bytes]]
) -> list[OSError | None]:
    """Write many whole files (as ``pipe`` each); per item None or its ``OSError``."""
    pairs = list(items.items()) if isinstance(items, dict) else list(items)
    for _, data in pairs:
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"put_many content must be bytes-like, got {type(data).__name__}")
    out: list[OSError | None] = [None] * len(pairs)
    last: dict[str, int] = {}  # normalised path -> the item written there (the last one)
    for i, (path, _) in enumerate(pairs):
        try:
            last[P.normalize(path)] = i
        except OSError as exc:
            out[i] = exc
    small_max = min(client.config.inline_put_max_bytes, wb.PUT_MANY_ITEM_BYTES_MAX)
    small: list[_Item] = []
    pipe_slots = asyncio.Semaphore(PIPES_INFLIGHT)

    async def pipe(i: int, path: str) -> None:
        async with pipe_slots:
            try:
                await client.pipe(path, pairs[i][1])
            except OSError as exc:
                out[i] = exc

    async with _tasks() as tg:
        for path, i in sorted(last.items(), key=lambda kv: kv[1]):
            if len(pairs[i][1]) <= small_max:
                small.append((i, path))
            else:
                tg.create_task(pipe(i, path))
        for group in _requests(small, [len(pairs[i][1]) for i in range(len(pairs))]):
            while group:
                contents = [bytes(pairs[i][1]) for i, _ in group]
                req = wb.PutManyReq(paths=[p for _, p in group], lengths=[len(c) for c in contents],
                                    crcs=[crc32c.crc32c(c) for c in contents], client_id=client.client_id)
                body: wb.PutManyRsp = (await _call(client, wb.PUT_MANY, req, payload=b"".join(contents))).body
                count = _answered(body.count, len(group), wb.PUT_MANY)
                _item_errors(body.errors, group, count, out)
                for k in body.fallback:
                    if not 0 <= k < count:
                        raise ProtocolError(f"put_many reply: bad fallback item {k}")
                    tg.create_task(pipe(*group[k]))
                group = group[count:]
    return out


# --- helpers ----------------------------------------------------------------------------


@asynccontextmanager
async def _tasks() -> AsyncIterator[asyncio.TaskGroup]:
    """A task group that raises its first error itself, not an exception group (callers
    expect the ``OSError`` a single call raises)."""
    try:
        async with asyncio.TaskGroup() as tg:
            yield tg
    except BaseExceptionGroup as eg:
        first: BaseException = eg
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None


def _normalised(paths: Sequence[str], out: list[Any]) -> list[_Item]:
    todo: list[_Item] = []
    for i, path in enumerate(paths):
        try:
            todo.append((i, P.normalize(path)))
        except OSError as exc:
            out[i] = exc
    return todo


def _requests(todo: list[_Item], sizes: Sequence[int] | None = None) -> list[list[_Item]]:
    """``todo`` split into requests within the bounds (``sizes``: contents per caller index)."""
    groups: list[list[_Item]] = []
    cur: list[_Item] = []
    path_bytes = data_bytes = 0
    for item in todo:
        pb = len(item[1].encode("utf-8", "surrogateescape")) + 5
        db = sizes[item[0]] if sizes is not None else 0
        if cur and (len(cur) >= wb.BATCH_ITEMS_MAX or path_bytes + pb > wb.REQUEST_PATH_BYTES_MAX
                    or data_bytes + db > wb.PUT_MANY_DATA_BYTES_MAX):
            groups.append(cur)
            cur, path_bytes, data_bytes = [], 0, 0
        cur.append(item)
        path_bytes += pb
        data_bytes += db
    if cur:
        groups.append(cur)
    return groups


def _answered(count: int, sent: int, m: Method) -> int:
    if not 1 <= count <= sent:
        raise ProtocolError(f"{m.name} reply answers {count} of {sent} items")
    return count


def _item_errors(errors: list[wb.ItemError], items: list[_Item], count: int, out: list[Any]) -> None:
    for e in errors:
        if not 0 <= e.index < count or e.status == Status.OK:
            raise ProtocolError(f"batch reply: bad error item {e.index}")
        i, path = items[e.index]
        out[i] = from_status(e.status, e.message, path=path)


def _finished(paths: Sequence[str], out: list[Any]) -> list[Any]:
    return [r if r is not None else ProtocolError("not answered", path=paths[i]) for i, r in enumerate(out)]


async def _call(client: AsyncClient, m: Method, req: Message, *, payload: bytes | None = None) -> Response[Any]:
    """``MetaClient.call_full``: the same failover over the meta servers, with a request
    payload, returning the reply's payload too."""
    if client.meta.rpc is None:
        raise ConnectionFailed("no RPC client: cannot reach meta")
    return await client.meta.call_full(m, req, payload=payload)
