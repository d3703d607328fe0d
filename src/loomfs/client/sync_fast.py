"""What the blocking API does on the caller's thread, with no hop to the loop when it can:
stat (a relaxed cache hit, or one STAT to meta over ``SyncMetaPath``), unlink, cat (one
READ) and pipe (one put: OPEN carrying the bytes), and ``CachedFile``, what a relaxed
``open(path, "rb")`` returns from the caches. Anything else goes to the loop (``sync_bridge``).
"""

from __future__ import annotations

import io
import os
from typing import Any

from loomfs.client import paths
from loomfs.client.fastpath import Unavailable
from loomfs.client.inline import INLINE_CAP_BYTES, stored_inline
from loomfs.client.session_ids import session_ids
from loomfs.client.sync_bridge import SyncBridge
from loomfs.client.sync_wire import (
    _inline_bytes_of_wire,
    _path_body,
    _put_open_body,
    _stat_result_of_wire,
)
from loomfs.wire import meta as wmeta
from loomfs.wire.types import Attr


class CallerThreadOps(SyncBridge):
    """The calls of ``LoomFS`` that run on the caller's thread when they can."""

    def _fast_stat(self, path: str, follow_symlinks: bool) -> Attr:
        """stat on the caller's thread: a relaxed cache hit (no round trip, no thread hop),
        else the caller-thread fast path to meta, else the async core."""
        return self._stat_any(path, follow_symlinks, False)  # type: ignore[return-value]

    def _stat_any(self, path: str, follow_symlinks: bool, as_stat: bool) -> Attr | os.stat_result:
        """``_fast_stat``; ``as_stat``: the caller wants an ``os.stat_result`` and may get one
        built straight from meta's reply (strict paths: no ``Attr`` is needed for a cache)."""
        self._check_thread()
        client = self._ensure()
        p = paths.normalize(path)
        if client.lazy.pending(p):  # this client's "w" file there: created on the loop first
            return self._submit(client.stat(p) if follow_symlinks else client.lstat(p))
        caches = client.caches
        relaxed = caches.relaxed(p)  # strict (the default): nothing to look up or learn
        if relaxed:
            hit = client.cached_attr(p, follow_symlinks)
            if hit is not None:
                return hit
        fast = self._fast
        if fast is not None:
            asked = caches.now() if relaxed else 0.0
            try:
                body = fast.call(wmeta.STAT, _path_body(p, follow_symlinks), decode=False)
            except Unavailable:
                pass
            except FileNotFoundError:
                if relaxed:
                    caches.learn_absent(p, follow_symlinks, asked_at=asked)
                raise
            else:
                if as_stat and not relaxed:
                    st = _stat_result_of_wire(body.get("attr"))
                    if st is not None:
                        return st
                rsp = wmeta.AttrRsp.from_wire(body)
                if rsp.attr is not None:
                    if relaxed:
                        caches.learn_attr(p, follow_symlinks, rsp.attr, asked_at=asked)
                    return rsp.attr
        return self._submit(client.stat_meta(p, follow_symlinks))

    def unlink(self, path: str) -> None:
        """One UNLINK from the caller's thread when it can (no hop to the loop)."""
        self._check_thread()
        client = self._ensure()
        p = paths.normalize(path)
        if self._fast_change(wmeta.UNLINK, _path_body(p, False), p, decode=False) is None:
            self._submit(client.unlink(p))

    def _fast_change(self, m: Any, req: Any, p: str, *, decode: bool = True) -> Any:
        """A namespace change sent from the caller's thread; None: take the async path (no
        fast path, a "w" file of this client pending at ``p``, or a lost reply: the async
        path sends it again). POSIX errors are raised as they are. ``decode`` False: the
        reply's body undecoded (``SyncMetaPath.call``)."""
        client = self._client
        fast = self._fast
        if fast is None or client is None or client.lazy.pending(p):
            return None
        try:
            return fast.call(m, req, resend_safe=True, decode=decode)
        except Unavailable:
            return None
        finally:
            client.caches.changed(p)  # whatever happened, this client changed it


    def cat(self, path: str) -> bytes:
        """A whole file, on the caller's thread when it can: a relaxed cache hit (no round
        trip), or one READ (an inline file, or a chunked one whose version the data cache
        holds); otherwise the chunks are read on the loop."""
        self._check_thread()
        client = self._ensure()
        p = paths.normalize(path)
        if client.lazy.pending(p):  # this client's "w" file there: created on the loop first
            return self._submit(client.cat(p))
        caches = client.caches
        relaxed = caches.relaxed(p)  # strict (the default): no cached attributes to look at
        if relaxed:
            data = client.cached_content(p)
            if data is not None:
                return data
        fast = self._fast
        if fast is not None:
            asked = caches.now()
            try:
                body = fast.call(wmeta.READ, _path_body(p, True), decode=False)
            except Unavailable:
                body = None
            except FileNotFoundError:
                if relaxed:
                    caches.learn_absent(p, True, asked_at=asked)
                raise
            if body is not None and not relaxed:
                data = _inline_bytes_of_wire(p, body)  # the usual strict answer: nothing to learn
                if data is not None:
                    return data
            if body is not None:
                rsp = wmeta.ReadRsp.from_wire(body)
                client.learn_read(p, rsp, asked)
                data = client.content_of_read(p, rsp)
                if data is not None:
                    return data
                return self._submit(client.cat_from(p, rsp))
        return self._submit(client.cat(p))

    def pipe(self, path: str, data: bytes | bytearray | memoryview) -> None:
        """Write ``data`` as the whole file. A small one is one put (OPEN carrying the bytes)
        from the caller's thread; meta keeps it inline, or answers with a write session and
        the bytes go to chunks on the loop."""
        self._check_thread()
        client = self._ensure()
        p = paths.normalize(path)
        view = memoryview(data)
        if view.nbytes <= min(client.config.inline_put_max_bytes, INLINE_CAP_BYTES):
            body = data if type(data) is bytes else view.tobytes()
            req = _put_open_body(p, client.client_id, session_ids.take(), body)
            raw = self._fast_change(wmeta.OPEN, req, p, decode=False)
            if raw is not None:
                if stored_inline(raw):  # the usual answer: nothing more to do, nothing to decode
                    return
                self._submit(client.finish_put(p, wmeta.OpenRsp.from_wire(raw), body))
                return
        self._submit(client.pipe(p, data))


class CachedFile(io.BytesIO):
    """A read-only binary file over one whole cached version of a file: what a relaxed
    ``open(path, "rb")`` returns when the caches hold the file's attributes and content
    (reads are memory copies on the caller's thread, no round trip)."""

    def __init__(self, name: str, data: bytes):
        super().__init__(data)  # shares ``data`` until written, and it is never written
        self.name = name
        self.mode = "rb"  # type: ignore[misc]
        self._size = len(data)

    def writable(self) -> bool:
        return False

    def write(self, b: Any) -> int:
        raise io.UnsupportedOperation("file not open for writing")

    def writelines(self, lines: Any) -> None:
        raise io.UnsupportedOperation("file not open for writing")

    def truncate(self, size: int | None = None) -> int:
        raise io.UnsupportedOperation("file not open for writing")

    def __repr__(self) -> str:
        return f"CachedFile({self.name} {self._size} bytes)"
