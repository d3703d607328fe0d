"""``kvcache._index.read_entries``: a get's entries straight from READ_MANY replies (no
sockets: a meta double answering crafted replies)."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
from typing import Any

import crc32c
import pytest

from loomfs.errors import ChecksumError, ProtocolError
from loomfs.kvcache import _index
from loomfs.net.rpc_client import Response
from loomfs.wire import meta_batch as wb
from loomfs.wire.types import Attr


class _Meta:
    """Answers READ_MANY from ``files`` (path -> bytes, or an errno), at most ``per_reply``
    items a reply; ``chunked`` paths are answered as files in chunks."""

    rpc = object()

    def __init__(self, files: dict[str, Any], per_reply: int = 1 << 30, chunked: frozenset[str] = frozenset(),
                 rot: frozenset[str] = frozenset()):
        self.files, self.per_reply, self.chunked, self.rot = files, per_reply, chunked, rot
        self.requests: list[list[str]] = []

    async def call_full(self, m: Any, req: wb.PathsReq) -> Response[Any]:
        assert m is wb.READ_MANY
        self.requests.append(list(req.paths))
        paths = req.paths[: self.per_reply]
        lengths, crcs, parts, errors, chunked = [], [], [], [], []
        for i, p in enumerate(paths):
            f = self.files.get(p, errno.ENOENT)
            if p in self.chunked:
                lengths.append(-1)
                crcs.append(0)
                chunked.append(wb.IndexedAttr(index=i, attr=Attr(inode=1, type=1)))
            elif isinstance(f, int):
                lengths.append(-1)
                crcs.append(0)
                errors.append(wb.ItemError(index=i, status=f, message="nope"))
            else:
                lengths.append(len(f))
                crcs.append(crc32c.crc32c(f) ^ (1 if p in self.rot else 0))
                parts.append(f)
        body = wb.ReadManyRsp(count=len(paths), lengths=lengths, crcs=crcs, errors=errors, chunked=chunked)
        return Response(body, memoryview(b"".join(parts)))


class _Client:
    def __init__(self, meta: _Meta):
        self.meta = meta
        self.general: list[str] = []

    async def read_many(self, paths: list[str]) -> list[bytes | OSError]:
        self.general += paths
        return [b"from chunks:" + p.encode() for p in paths]


def _run(meta: _Meta, paths: list[str]) -> tuple[list[Any], _Client]:
    client = _Client(meta)
    got = asyncio.run(_index.read_entries(client, paths, bytes))
    return got, client


def test_items_errors_rot_and_chunked_fallback() -> None:
    files = {f"/kv/index/{i:02x}": bytes([i]) * (i % 7) for i in range(40)}
    paths = list(files) + ["/kv/index/missing", "/kv/index/chunky"]
    meta = _Meta(files, chunked=frozenset({"/kv/index/chunky"}), rot=frozenset({"/kv/index/05"}))
    got, client = _run(meta, paths)
    for p, g in zip(paths[:40], got[:40], strict=True):
        if p == "/kv/index/05":
            assert isinstance(g, ChecksumError)
        else:
            assert g == files[p], p
    assert isinstance(got[40], FileNotFoundError) and got[40].filename == "/kv/index/missing"
    assert got[41] == b"from chunks:/kv/index/chunky" and client.general == ["/kv/index/chunky"]
    assert len(meta.requests) == 1


def test_partial_replies_are_followed_and_big_batches_split(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_index, "REQUEST_ITEMS", 16)
    files = {f"/i/{i}": str(i).encode() for i in range(50)}
    meta = _Meta(files, per_reply=5)
    got, _ = _run(meta, list(files))
    assert got == list(files.values())
    assert max(len(r) for r in meta.requests) == 16  # split into requests of 16
    assert len(meta.requests) == 4 * 3 + 1  # 16 = 5+5+5+1 each, then 2 = one more


@pytest.mark.parametrize("bad", ["count0", "count_over", "lengths", "past_payload", "long_payload", "error_index",
                                 "unanswered"])
def test_malformed_replies_raise(bad: str) -> None:
    class Bad(_Meta):
        async def call_full(self, m: Any, req: wb.PathsReq) -> Response[Any]:
            rsp = await super().call_full(m, req)
            b: wb.ReadManyRsp = rsp.body
            payload = rsp.payload
            if bad == "count0":
                b = dataclasses.replace(b, count=0)
            elif bad == "count_over":
                b = dataclasses.replace(b, count=len(req.paths) + 1)
            elif bad == "lengths":
                b.lengths.pop()
            elif bad == "past_payload":
                b.lengths[-1] += 1
            elif bad == "long_payload":
                payload = memoryview(bytes(payload) + b"x")
            elif bad == "error_index":
                b.errors.append(wb.ItemError(index=0, status=errno.ENOENT, message="x"))
            else:
                b.lengths[1] = -1
                payload = memoryview(bytes(payload)[: -len(b"bb")])
            return Response(b, payload)

    with pytest.raises(ProtocolError):
        _run(Bad({"/a": b"aa", "/b": b"bb"}), ["/a", "/b"])
