"""The blocking API: ``loomfs.connect()`` -> ``LoomFS``, running the async core on one
daemon event-loop thread named ``loomfs-io``.

Calls from that thread are refused (they would deadlock). After ``os.fork()`` (DataLoader
workers) the facade sees the pid changed and starts a fresh loop and client in the child;
file objects opened before the fork are not usable there.
"""

from __future__ import annotations

import _thread
import asyncio
import atexit
import contextlib
import contextvars
import dataclasses
import io
import json
import logging
import os
import shutil
import stat as stat_mod
import threading
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from typing import Any, TypeVar

import crc32c

from loomfs.client import paths, xattrs
from loomfs.client.core import LAZY_FLAGS, READDIR_PAGE, AsyncClient, info_of
from loomfs.client.fastpath import SyncMetaPath, Unavailable
from loomfs.client.file import AsyncFile, parse_mode
from loomfs.client.inline import INLINE_CAP_BYTES, check_crc, stored_inline
from loomfs.client.meta_client import MetaClient
from loomfs.client.session_ids import session_ids
from loomfs.client.syncfile import LoomFile
from loomfs.common import trace
from loomfs.common.routing import parse_addresses
from loomfs.config import ClientConfig
from loomfs.errors import LoomError
from loomfs.net.auth import CLUSTER_TOKEN_FILE, TOKEN_FILE_ENV
from loomfs.wire import meta as wmeta
from loomfs.wire.meta import StatfsRsp
from loomfs.wire.types import Attr, FileType, Layout

logger = logging.getLogger(__name__)

T = TypeVar("T")
LOOP_THREAD_NAME = "loomfs-io"
CLOSE_WAIT_S = 60.0
COPY_BLOCK_BYTES = 8 << 20
ClientFactory = Callable[[], Awaitable[AsyncClient]]

_lock = threading.Lock()


_PID = [os.getpid()]  # this process's pid, kept by the fork hook (no getpid per call)


def _reset_lock() -> None:
    global _lock
    _lock = threading.Lock()
    _PID[0] = os.getpid()


os.register_at_fork(after_in_child=_reset_lock)


def resolve_mgmtd(address: str | None) -> str:
    """'host:port[,host:port]' or a local cluster directory (its cluster.json) -> mgmtd list."""
    text = address if address is not None else os.environ.get("LOOMFS_CLUSTER", "")
    if not text:
        raise ValueError(
            "no LoomFS cluster given: pass loomfs.connect('host:port') or a local cluster "
            "directory (from `loomfs local up`), or set LOOMFS_CLUSTER"
        )
    if os.path.isdir(text):
        path = os.path.join(text, "cluster.json")
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError) as exc:
            raise ValueError(f"{text} is not a LoomFS cluster directory: cannot read {path}: {exc}") from exc
        mgmtd = data.get("mgmtd") if isinstance(data, dict) else None
        if not isinstance(mgmtd, str) or not mgmtd:
            raise ValueError(f"{path} has no \"mgmtd\" address")
        text = mgmtd
    if not parse_addresses(text):
        raise ValueError(f"no mgmtd address in {text!r}")
    return text


def with_cluster_token(address: str | None, config: ClientConfig | None) -> ClientConfig | None:
    """A local cluster directory given as ``address`` (``loomfs local up``) holds its admin
    token: use it when neither ``config.rpc.token_file`` nor $LOOMFS_TOKEN_FILE names one
    (auth is on in such clusters; $LOOMFS_CLUSTER's token is found by ``net.auth`` already)."""
    if not address or not os.path.isdir(address) or os.environ.get(TOKEN_FILE_ENV):
        return config
    token = os.path.join(address, CLUSTER_TOKEN_FILE)
    if not os.path.isfile(token) or (config is not None and config.rpc.token_file):
        return config
    base = config or ClientConfig()
    return dataclasses.replace(base, rpc=dataclasses.replace(base.rpc, token_file=os.path.abspath(token)))


def _close_at_exit(ref: weakref.ref[LoomFS]) -> None:
    fs = ref()
    if fs is not None:
        fs.close()


def _new_loop() -> asyncio.AbstractEventLoop:
    """asyncio's loop; uvloop only when asked (LOOMFS_UVLOOP=1): measured here it was not
    faster, and asyncio's loop lets large sends skip the transport's buffer copy."""
    if os.environ.get("LOOMFS_UVLOOP") == "1":
        try:
            import uvloop

            loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
            return loop
        except ImportError:
            logger.warning("LOOMFS_UVLOOP=1 but uvloop is not installed (pip install loomfs[uvloop])")
    return asyncio.new_event_loop()


class LoomFS:
    """Blocking twins of every ``AsyncClient`` call, plus cat/put/get."""

    def __init__(
        self,
        address: str | None = None,
        *,
        config: ClientConfig | None = None,
        client_factory: ClientFactory | None = None,
    ):
        if client_factory is None:
            mgmtd = resolve_mgmtd(address)
            config = with_cluster_token(address, config)
            client_factory = lambda: AsyncClient.connect(mgmtd, config)  # noqa: E731
        self.address = address
        self._factory = client_factory
        self._pid = -1
        self._generation = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._loop_ident = -1  # the loop thread's ident (_check_thread: one compare per call)
        self._client: AsyncClient | None = None
        self._fast: SyncMetaPath | None = None  # caller-thread metadata reads
        self._metrics: Any = None  # loomfs.metrics.ServiceMetrics once serve_metrics() ran
        self.closed = False
        self._ensure()
        atexit.register(_close_at_exit, weakref.ref(self))

    # --- the loop thread ----------------------------------------------------------------

    def _ensure(self) -> AsyncClient:
        if self._pid == _PID[0] and self._client is not None:
            return self._client
        if self.closed:
            raise ValueError("LoomFS client is closed")
        with _lock:
            if self._pid == os.getpid() and self._client is not None:
                return self._client
            if self._pid != -1:
                logger.info("pid changed (%d -> %d): starting a fresh LoomFS client", self._pid, os.getpid())
            loop = _new_loop()
            thread = threading.Thread(target=loop.run_forever, name=LOOP_THREAD_NAME, daemon=True)
            thread.start()
            try:
                client = asyncio.run_coroutine_threadsafe(self._connect(), loop).result()
            except BaseException:
                loop.call_soon_threadsafe(loop.stop)
                thread.join(5.0)
                raise
            self._loop, self._thread, self._client = loop, thread, client
            self._loop_ident = thread.ident if thread.ident is not None else -1
            meta = getattr(client, "meta", None)
            self._fast = SyncMetaPath(meta) if isinstance(meta, MetaClient) and meta.rpc is not None else None
            self._generation += 1
            self._pid = os.getpid()
            return client

    async def _connect(self) -> AsyncClient:
        return await self._factory()

    def _submit(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop thread and block until it finishes.

        Leaner than ``run_coroutine_threadsafe`` (one futex wait, no chained futures):
        sequential small calls are bound by this hop, ~10% of a ``stat``.
        """
        loop = self._loop
        assert loop is not None
        done = _thread.allocate_lock()
        done.acquire()
        box: list[asyncio.Task[T]] = []

        def finished(task: asyncio.Task[T]) -> None:
            done.release()

        ctx = contextvars.copy_context()
        ctx.run(trace.TRACE.set, trace.new_id())  # one trace id for all RPCs of this call

        def start() -> None:
            task = loop.create_task(coro, context=ctx)
            box.append(task)
            task.add_done_callback(finished)

        loop.call_soon_threadsafe(start)
        try:
            done.acquire()
        except BaseException:  # e.g. KeyboardInterrupt while waiting: stop the work too
            # callbacks run in FIFO order, so start() has created the task by then
            loop.call_soon_threadsafe(lambda: box[0].cancel())
            raise
        task = box[0]
        if task.cancelled():
            raise LoomError("operation cancelled", errno=125)
        return task.result()

    def _check_thread(self) -> None:
        if _thread.get_ident() == self._loop_ident and threading.current_thread() is self._thread:
            raise RuntimeError(
                "blocking LoomFS call from its own event loop thread 'loomfs-io' would deadlock; "
                "use the AsyncClient (fs.client) there"
            )

    def _run(self, make: Callable[[AsyncClient], Coroutine[Any, Any, T]]) -> T:
        self._check_thread()
        client = self._ensure()
        return self._submit(make(client))

    def _run_file(self, generation: int, make: Callable[[], Awaitable[T]]) -> T:
        self._check_thread()
        self._ensure()
        if generation != self._generation:
            raise LoomError("file was opened before fork (or by a closed client); reopen it", errno=9)

        async def call() -> T:
            return await make()

        return self._submit(call())

    def _close_file(self, generation: int, afile: AsyncFile) -> None:
        if generation != self._generation or self._pid != os.getpid() or self._loop is None:
            return  # the loop that owned it is gone
        if self._thread is not None and threading.current_thread() is self._thread:
            self._loop.create_task(afile.close())  # e.g. garbage-collected on the loop thread
            return
        if not self._loop.is_running():
            return
        self._submit(afile.close())

    @property
    def client(self) -> AsyncClient:
        """The async core (use it from coroutines on the loop thread)."""
        return self._ensure()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        self._ensure()
        assert self._loop is not None
        return self._loop

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._pid != os.getpid() or self._loop is None or self._client is None:
            return
        loop, client, thread = self._loop, self._client, self._thread
        try:
            if loop.is_running():
                if self._metrics is not None:
                    asyncio.run_coroutine_threadsafe(self._metrics.close(), loop).result(CLOSE_WAIT_S)
                    self._metrics = None
                asyncio.run_coroutine_threadsafe(client.close(), loop).result(CLOSE_WAIT_S)
        except Exception as exc:
            logger.warning("closing LoomFS client: %s", exc)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            if thread is not None and thread is not threading.current_thread():
                thread.join(5.0)
            self._client = None
            if self._fast is not None:
                self._fast.close()
                self._fast = None

    def serve_metrics(self, port: int = 0, host: str = "127.0.0.1") -> int:
        """Serve this client's Prometheus /metrics (RPC counts, bytes and latency, read-ahead
        and buffer-pool hits/misses, retries); returns the bound port (0 = any free one)."""
        from loomfs.metrics import ClientCollector, start_service_metrics

        if self._metrics is None:
            client = self._ensure()
            self._metrics = self._submit(start_service_metrics(
                "client", None, client.rpc, port=port, host=host, collectors=[ClientCollector(client)]
            ))
        return int(self._metrics.port)

    def __enter__(self) -> LoomFS:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- namespace ----------------------------------------------------------------------

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

    def stat(self, path: str) -> os.stat_result:
        """Like ``os.stat``: follows symlinks; ``st_mode`` carries the file type bits."""
        r = self._stat_any(path, True, True)
        return r if isinstance(r, os.stat_result) else stat_result(r)

    def lstat(self, path: str) -> os.stat_result:
        r = self._stat_any(path, False, True)
        return r if isinstance(r, os.stat_result) else stat_result(r)

    def attr(self, path: str, *, follow_symlinks: bool = True) -> Attr:
        """The raw LoomFS attributes (inode, layout, ...)."""
        return self._fast_stat(path, follow_symlinks)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine that uses ``fs.client`` on the client's loop and wait for it."""
        self._check_thread()
        self._ensure()
        return self._submit(coro)

    def info(self, path: str) -> dict[str, Any]:
        return info_of(paths.normalize(path), self._fast_stat(path, False))

    def exists(self, path: str) -> bool:
        try:
            self._fast_stat(path, True)
        except FileNotFoundError:
            return False
        return True

    def isdir(self, path: str) -> bool:
        try:
            return self._fast_stat(path, True).type == FileType.DIRECTORY
        except FileNotFoundError:
            return False

    def isfile(self, path: str) -> bool:
        try:
            return self._fast_stat(path, True).type == FileType.FILE
        except FileNotFoundError:
            return False

    def listdir(self, path: str = "/") -> list[str]:
        return self._run(lambda c: c.listdir(path))

    def ls(self, path: str = "/", detail: bool = False) -> list[Any]:
        return self._run(lambda c: c.ls(path, detail))

    def iterdir(self, path: str = "/", detail: bool = False) -> Iterator[Any]:
        """Stream a directory's entries (full paths, or info dicts with ``detail``), one
        READDIR page at a time: a directory of millions is never held in memory at once."""
        top = paths.normalize(path)
        after = ""
        while True:
            entries, more = self._run(lambda c, a=after: _page(c, top, a, detail))  # type: ignore[misc]
            for e in entries:
                child = paths.join(top, e.name)
                yield info_of(child, e.attr) if detail and e.attr is not None else child
            if not more or not entries:
                return
            after = entries[-1].name

    def mkdir(self, path: str, mode: int = 0o755, *, parents: bool = False, exist_ok: bool = False) -> Attr:
        return self._run(lambda c: c.mkdir(path, mode, parents=parents, exist_ok=exist_ok))

    def makedirs(self, path: str, exist_ok: bool = False, mode: int = 0o755) -> Attr:
        return self._run(lambda c: c.makedirs(path, exist_ok, mode))

    def rmdir(self, path: str) -> None:
        self._run(lambda c: c.rmdir(path))

    def rm(self, path: str, recursive: bool = False) -> None:
        self._run(lambda c: c.rm(path, recursive))

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

    def rmtree(self, path: str) -> None:
        self._run(lambda c: c.rmtree(path))

    def rename(self, src: str, dst: str, *, no_replace: bool = False) -> None:
        self._run(lambda c: c.rename(src, dst, no_replace=no_replace))

    mv = rename

    def walk(self, path: str = "/", topdown: bool = True) -> Iterator[tuple[str, list[str], list[str]]]:
        from loomfs.client import paths as _paths
        from loomfs.wire.types import FileType

        top = _paths.normalize(path)
        entries = self._run(lambda c: c.scandir(top))
        dirs = [e.name for e in entries if e.type == FileType.DIRECTORY]
        files = [e.name for e in entries if e.type != FileType.DIRECTORY]
        if topdown:
            yield top, dirs, files
        for d in dirs:
            yield from self.walk(_paths.join(top, d), topdown)
        if not topdown:
            yield top, dirs, files

    def symlink(self, target: str, path: str) -> None:
        self._run(lambda c: c.symlink(target, path))

    def readlink(self, path: str) -> str:
        return self._run(lambda c: c.readlink(path))

    def link(self, src: str, dst: str) -> None:
        self._run(lambda c: c.link(src, dst))

    def chmod(self, path: str, mode: int) -> None:
        self._run(lambda c: c.chmod(path, mode))

    def chown(self, path: str, uid: int = -1, gid: int = -1) -> None:
        self._run(lambda c: c.chown(path, uid, gid))

    def utime(self, path: str, times: tuple[float, float] | None = None, *, ns: tuple[int, int] | None = None) -> None:
        self._run(lambda c: c.utime(path, times, ns=ns))

    def truncate(self, path: str, size: int) -> None:
        self._run(lambda c: c.truncate(path, size))

    def set_layout(
        self,
        path: str,
        layout: Layout | None = None,
        *,
        chunk_size: int | None = None,
        stripe: int | None = None,
        replicas: int | None = None,
        table_id: int | None = None,
        inline_max_bytes: int | None = None,
        durable: bool | None = None,
    ) -> Layout | None:
        """Set a directory's layout; keyword arguments change only those fields
        (``inline_max_bytes``: files up to this size keep their bytes in meta; 0 = never,
        -1 = the meta server's default)."""
        if layout is None:
            cur = self.get_layout(path) or Layout()
            changes: dict[str, object] = {k: v for k, v in (
                ("chunk_size", chunk_size), ("stripe", stripe), ("replicas", replicas), ("table_id", table_id),
                ("inline_max_bytes", inline_max_bytes), ("durable", durable)) if v is not None}
            layout = dataclasses.replace(cur, chains=[], **changes)  # type: ignore[arg-type]
        self._run(lambda c: c.set_layout(path, layout))
        return self.get_layout(path)

    def get_layout(self, path: str) -> Layout | None:
        return self._run(lambda c: c.get_layout(path))

    def statfs(self) -> StatfsRsp:
        return self._run(lambda c: c.statfs())

    # --- extended attributes (user.*; like os.getxattr & co.) ------------------------------

    def getxattr(self, path: str, name: str | bytes, *, follow_symlinks: bool = True) -> bytes:
        return self._run(lambda c: xattrs.getxattr(c, path, name, follow_symlinks=follow_symlinks))

    def listxattr(self, path: str, *, follow_symlinks: bool = True) -> list[str]:
        return self._run(lambda c: xattrs.listxattr(c, path, follow_symlinks=follow_symlinks))

    def setxattr(self, path: str, name: str | bytes, value: bytes, flags: int = 0, *,
                 follow_symlinks: bool = True) -> None:
        """``flags``: ``os.XATTR_CREATE`` / ``os.XATTR_REPLACE``."""
        self._run(lambda c: xattrs.setxattr(c, path, name, value, flags, follow_symlinks=follow_symlinks))

    def removexattr(self, path: str, name: str | bytes, *, follow_symlinks: bool = True) -> None:
        self._run(lambda c: xattrs.removexattr(c, path, name, follow_symlinks=follow_symlinks))

    # --- data ---------------------------------------------------------------------------

    def open(
        self,
        path: str,
        mode: str = "rb",
        *,
        encoding: str | None = None,
        errors: str | None = None,
        newline: str | None = None,
    ) -> Any:
        """A binary ``io.BufferedIOBase`` file; text modes ('r', 'wt', ...) wrap it in TextIOWrapper."""
        flags, binary = parse_mode(mode)
        bmode = mode.replace("t", "") + ("" if binary else "b")
        f: io.BufferedIOBase | None = None
        if flags == os.O_RDONLY:  # relaxed: a cached whole version, on the caller's thread
            self._check_thread()
            p = paths.normalize(path)
            data = self._ensure().cached_content(p)
            if data is not None:
                f = CachedFile(p, data)
        if f is None:
            afile = self._run(lambda c: c.open(path, bmode))
            f = LoomFile(self, afile, bmode, self._generation)
        if binary:
            return f
        return io.TextIOWrapper(f, encoding=encoding or "utf-8", errors=errors, newline=newline)

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

    def put(self, local_path: str | os.PathLike[str], remote_path: str) -> None:
        """Copy a local file into LoomFS."""
        with open(local_path, "rb") as src, self.open(remote_path, "wb") as dst:
            shutil.copyfileobj(src, dst, COPY_BLOCK_BYTES)

    def get(self, remote_path: str, local_path: str | os.PathLike[str]) -> None:
        """Copy a LoomFS file to the local file system."""
        with self.open(remote_path, "rb") as src, open(local_path, "wb") as dst:
            shutil.copyfileobj(src, dst, COPY_BLOCK_BYTES)

    # --- cluster-wide locks (loomfs.client.sync_locks; docs/mount.md) ----------------------

    def lock(self, path: str, type_: int | None = None, **kw: Any) -> None:
        """Lock ``path`` for the whole cluster: ``type_`` READ (shared) or WRITE (exclusive,
        the default) from ``loomfs.client.locks``; keywords as ``sync_locks.lock`` (kind,
        first, last, owner, wait, wait_max_s)."""
        from loomfs.client import sync_locks

        sync_locks.lock(self, path, sync_locks.WRITE if type_ is None else type_, **kw)

    def unlock(self, path: str, **kw: Any) -> None:
        from loomfs.client import sync_locks

        sync_locks.unlock(self, path, **kw)

    def locked(self, path: str, type_: int | None = None, **kw: Any) -> contextlib.AbstractContextManager[None]:
        """``lock`` for a ``with`` block, unlocked at its end (also on an exception)."""
        from loomfs.client import sync_locks

        return sync_locks.locked(self, path, sync_locks.WRITE if type_ is None else type_, **kw)

    # --- batches (one meta round trip for many paths) ------------------------------------

    def read_many(self, paths_: Sequence[str]) -> list[bytes | OSError]:
        """Contents of many files at once; a failed item is its ``OSError``."""
        return self._run(lambda c: c.read_many(list(paths_)))

    def cat_many(self, paths_: Sequence[str]) -> dict[str, bytes]:
        """fsspec-style: path -> bytes; raises the first item's error."""
        out: dict[str, bytes] = {}
        for p, r in zip(paths_, self.read_many(paths_), strict=True):
            if isinstance(r, OSError):
                raise r
            out[p] = r
        return out

    def stat_many(self, paths_: Sequence[str], *, follow_symlinks: bool = True) -> list[os.stat_result | OSError]:
        rs = self._run(lambda c: c.stat_many(list(paths_), follow_symlinks=follow_symlinks))
        return [r if isinstance(r, OSError) else stat_result(r) for r in rs]

    def put_many(self, items: dict[str, bytes] | Sequence[tuple[str, bytes]]) -> list[OSError | None]:
        return self._run(lambda c: c.put_many(items))

    def rm_many(self, paths_: Sequence[str]) -> list[OSError | None]:
        return self._run(lambda c: c.rm_many(list(paths_)))

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"pid={self._pid} gen={self._generation}"
        return f"LoomFS({self.address!r} {state})"


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


_TYPE_BITS: dict[int, int] = {FileType.FILE: stat_mod.S_IFREG, FileType.DIRECTORY: stat_mod.S_IFDIR,
              FileType.SYMLINK: stat_mod.S_IFLNK, FileType.FIFO: stat_mod.S_IFIFO,
              FileType.SOCKET: stat_mod.S_IFSOCK, FileType.CHAR_DEVICE: stat_mod.S_IFCHR,
              FileType.BLOCK_DEVICE: stat_mod.S_IFBLK}
STAT_BLKSIZE_BYTES = 1 << 20  # st_blksize, as the mount answers (tools size buffers by it)


async def _page(c: AsyncClient, top: str, after: str, detail: bool) -> tuple[list[Any], bool]:
    rsp = await c.meta.readdir(top, after, READDIR_PAGE, detail)
    return rsp.entries, rsp.more


def _path_body(p: str, follow_symlinks: bool) -> dict[str, Any]:
    """``wmeta.PathReq(path=p, follow_symlinks=...).to_wire()``, without the object (~0.5 us)."""
    return {"path": p, "follow_symlinks": follow_symlinks}


def _put_open_body(p: str, client_id: int, session_id: int, data: bytes) -> dict[str, Any]:
    """``wmeta.OpenReq(...).to_wire()`` of a put (a "w" create carrying its bytes), without
    the object: its constructor and encoder cost ~3 us of a put's client CPU."""
    return {"path": p, "flags": LAZY_FLAGS, "mode": 0o644, "uid": 0, "gid": 0, "client_id": client_id,
            "session_id": session_id, "data": data, "data_crc": crc32c.crc32c(data), "chunked": False}


def _stat_result_of_wire(a: object) -> os.stat_result | None:
    """``stat_result(Attr.from_wire(a))`` for an attribute map as meta sends it, without
    building the ``Attr`` (and its ``Layout``); None for anything else (a missing field, a
    field that is not an int): the caller decodes it whole, with its checks."""
    if type(a) is not dict:
        return None
    try:
        t, mode, inode, nlink, uid, gid, size = a["type"], a["mode"], a["inode"], a["nlink"], a["uid"], a["gid"], a["size"]
        at, mt, ct, rdev = a["atime_ns"], a["mtime_ns"], a["ctime_ns"], a["rdev"]
    except KeyError:
        return None
    if not (type(t) is int and type(mode) is int and type(inode) is int and type(nlink) is int
            and type(uid) is int and type(gid) is int and type(size) is int and type(at) is int
            and type(mt) is int and type(ct) is int and type(rdev) is int):
        return None
    return os.stat_result((
        _TYPE_BITS.get(t, 0) | (mode & 0o7777), inode, 0, nlink, uid, gid, size,
        at // 10**9, mt // 10**9, ct // 10**9, at / 1e9, mt / 1e9, ct / 1e9, at, mt, ct,
        STAT_BLKSIZE_BYTES, (size + 511) // 512, rdev,
    ))


def _inline_bytes_of_wire(p: str, body: dict[str, Any]) -> bytes | None:
    """A READ reply's bytes, undecoded, when it is an inline file's (checked against their
    CRC32C: EIO on a mismatch); None for anything else (decode it whole)."""
    data = body.get("data")
    attr = body.get("attr")
    crc = body.get("data_crc")
    if type(data) is not bytes or type(attr) is not dict or attr.get("type") != FileType.FILE or type(crc) is not int:
        return None
    return check_crc(p, data, crc)


def stat_result(a: Attr) -> os.stat_result:
    """LoomFS attributes as an ``os.stat_result`` (times in seconds and *_ns)."""
    mode = _TYPE_BITS.get(a.type, 0) | (a.mode & 0o7777)  # (FileType is an IntEnum: ints find it)
    return os.stat_result((
        mode, a.inode, 0, a.nlink, a.uid, a.gid, a.size,
        a.atime_ns // 10**9, a.mtime_ns // 10**9, a.ctime_ns // 10**9,
        a.atime_ns / 1e9, a.mtime_ns / 1e9, a.ctime_ns / 1e9,
        a.atime_ns, a.mtime_ns, a.ctime_ns,
        STAT_BLKSIZE_BYTES, (a.size + 511) // 512, a.rdev,  # st_blksize, st_blocks, st_rdev
    ))


def connect(
    address: str | None = None, *, config: ClientConfig | None = None, consistency: str | None = None,
) -> LoomFS:
    """Connect to a LoomFS cluster: 'host:port' of a mgmtd (comma list allowed), a local
    cluster directory (``loomfs local up``), or None for ``$LOOMFS_CLUSTER``.
    ``consistency``: "strict" or "relaxed" for this connection (overrides ``config``'s;
    per-prefix modes are in ``ClientConfig``, see docs/consistency.md)."""
    if consistency is not None:
        config = dataclasses.replace(config or ClientConfig(), consistency=consistency)
    return LoomFS(address, config=config)
