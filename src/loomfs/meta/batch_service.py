"""RPC adapter for the batch calls (``loomfs.wire.meta_batch``): bound, decode, ops, encode.

A second service object on the meta RPC server, next to ``MetaService``; the logic is in
``loomfs.meta.ops.batch``.
"""

from __future__ import annotations

import logging
from typing import Any

import crc32c

from loomfs.errors import StatusError
from loomfs.meta.ops.batch import BatchOps, Failed, Inline, Put, PutItem
from loomfs.meta.ops.namespace import Namespace
from loomfs.meta.readgrants import read_grant
from loomfs.meta.service import act_for
from loomfs.net.rpc import CallContext, Reply, handles
from loomfs.wire import meta_batch as wb
from loomfs.wire.status import Status
from loomfs.wire.types import Attr, Layout

logger = logging.getLogger(__name__)


def _check_count(n: int) -> None:
    if n > wb.BATCH_ITEMS_MAX:
        raise StatusError(Status.EINVAL, f"{n} items in one batch (max {wb.BATCH_ITEMS_MAX})")


def _error(index: int, f: Failed) -> wb.ItemError:
    return wb.ItemError(index=index, status=f.status, message=f.message)


class BatchService:
    def __init__(self, ns: Namespace, *, root_squash: bool = False):
        self.ops = BatchOps(ns)
        self.root_squash = root_squash

    @handles(wb.STAT_MANY)
    async def stat_many(self, req: wb.PathsReq, ctx: CallContext) -> wb.StatManyRsp:
        act_for(ctx, self.root_squash)
        _check_count(len(req.paths))
        results = await self.ops.stat_many(req.paths, follow_symlinks=req.follow_symlinks)
        errors: list[wb.ItemError] = []
        logger.debug("req %d: stat_many %d/%d paths", ctx.request_id, len(results), len(req.paths))
        if req.compact:
            rows: list[list[Any] | None] = []
            layouts: list[Layout] = []
            index: dict[int, int] = {}
            for i, r in enumerate(results):
                if isinstance(r, Failed):
                    rows.append(None)
                    errors.append(_error(i, r))
                else:
                    rows.append(wb.attr_row(r, layouts, index))
            return wb.StatManyRsp(count=len(results), errors=errors, rows=rows, layouts=layouts)
        attrs: list[Attr | None] = []
        for i, r in enumerate(results):
            if isinstance(r, Failed):
                attrs.append(None)
                errors.append(_error(i, r))
            else:
                attrs.append(r)
        return wb.StatManyRsp(count=len(results), attrs=attrs, errors=errors)

    @handles(wb.READ_MANY)
    async def read_many(self, req: wb.PathsReq, ctx: CallContext) -> Reply:
        act_for(ctx, self.root_squash)
        _check_count(len(req.paths))
        # no attributes for inline files (the reply carries none): the store's light lookup
        results = await self.ops.read_many(req.paths, follow_symlinks=req.follow_symlinks, attrs=False)
        lengths: list[int] = []
        crcs: list[int] = []
        chunked: list[wb.IndexedAttr] = []
        errors: list[wb.ItemError] = []
        contents: list[bytes] = []
        for i, r in enumerate(results):
            if type(r) is Inline:
                lengths.append(len(r.data))
                crcs.append(r.crc)
                contents.append(r.data)
            elif isinstance(r, Failed) or r.data is None:
                lengths.append(-1)
                crcs.append(0)
                if isinstance(r, Failed):
                    errors.append(_error(i, r))
                else:
                    chunked.append(wb.IndexedAttr(index=i, attr=r.attr))
            else:
                lengths.append(len(r.data))
                crcs.append(r.crc if r.crc >= 0 else crc32c.crc32c(r.data))
                contents.append(r.data)
        payload = b"".join(contents)
        logger.debug("req %d: read_many %d/%d paths, %d inline (%d bytes), %d chunked, %d errors", ctx.request_id,
                     len(results), len(req.paths), len(contents), len(payload), len(chunked), len(errors))
        rsp = wb.ReadManyRsp(count=len(results), lengths=lengths, crcs=crcs, chunked=chunked, errors=errors,
                             read_grants=[read_grant(c.attr, ctx) for c in chunked])
        return Reply(rsp, payload or None)

    @handles(wb.PUT_MANY)
    async def put_many(self, req: wb.PutManyReq, ctx: CallContext) -> wb.PutManyRsp:
        act_for(ctx, self.root_squash)
        n = len(req.paths)
        _check_count(n)
        if len(req.lengths) != n or len(req.crcs) != n:
            raise StatusError(Status.BAD_REQUEST, f"{n} paths but {len(req.lengths)} lengths and {len(req.crcs)} CRCs")
        total = 0
        for length in req.lengths:
            if not 0 <= length <= wb.PUT_MANY_ITEM_BYTES_MAX:
                raise StatusError(Status.EINVAL, f"put_many item of {length} bytes (max {wb.PUT_MANY_ITEM_BYTES_MAX})")
            total += length
        if total > wb.PUT_MANY_DATA_BYTES_MAX:
            raise StatusError(Status.EINVAL, f"put_many of {total} bytes (max {wb.PUT_MANY_DATA_BYTES_MAX})")
        if total != len(ctx.payload):
            raise StatusError(Status.BAD_REQUEST, f"lengths add up to {total}, payload has {len(ctx.payload)}")
        items: list[PutItem] = []
        pos = 0
        for path, length, crc in zip(req.paths, req.lengths, req.crcs, strict=True):
            items.append(PutItem(path, bytes(ctx.payload[pos : pos + length]), crc))  # the buffer is reused
            pos += length
        results = await self.ops.put_many(items, mode=req.mode, uid=req.uid, gid=req.gid, client_id=req.client_id)
        fallback: list[int] = []
        errors: list[wb.ItemError] = []
        for i, r in enumerate(results):
            if isinstance(r, Failed):
                errors.append(_error(i, r))
            elif r is Put.FALLBACK:
                fallback.append(i)
        logger.debug("req %d: put_many %d items (%d bytes), %d fallbacks, %d errors", ctx.request_id, n, total,
                     len(fallback), len(errors))
        return wb.PutManyRsp(count=len(results), fallback=fallback, errors=errors)

    @handles(wb.UNLINK_MANY)
    async def unlink_many(self, req: wb.PathsReq, ctx: CallContext) -> wb.UnlinkManyRsp:
        act_for(ctx, self.root_squash)
        _check_count(len(req.paths))
        results = await self.ops.unlink_many(req.paths)
        errors = [_error(i, r) for i, r in enumerate(results) if isinstance(r, Failed)]
        logger.debug("req %d: unlink_many %d paths, %d errors", ctx.request_id, len(results), len(errors))
        return wb.UnlinkManyRsp(count=len(results), errors=errors)

    def __repr__(self) -> str:
        return f"BatchService({self.ops.ns!r})"
