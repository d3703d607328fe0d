"""The blocking API: ``loomfs.connect()`` -> ``LoomFS``, running the async core on one
daemon event-loop thread named ``loomfs-io``.

Calls from that thread are refused (they would deadlock). After ``os.fork()`` (DataLoader
workers) the facade sees the pid changed and starts a fresh loop and client in the child;
file objects opened before the fork are not usable there.

The loop thread and the hop to it: ``sync_bridge``; the calls that run on the caller's
thread when they can (stat, unlink, cat, pipe): ``sync_fast``; the wire maps those build and
read by hand, and ``stat_result``: ``sync_wire``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import shutil
from collections.abc import Iterator, Sequence
from typing import Any

from loomfs.client import paths, xattrs
from loomfs.client.core import READDIR_PAGE, AsyncClient, info_of
from loomfs.client.file import parse_mode
from loomfs.client.sync_bridge import LOOP_THREAD_NAME, ClientFactory
from loomfs.client.sync_fast import CachedFile, CallerThreadOps
from loomfs.client.sync_wire import stat_result
from loomfs.client.syncfile import LoomFile
from loomfs.common.routing import parse_addresses
from loomfs.config import ClientConfig
from loomfs.net.auth import CLUSTER_TOKEN_FILE, TOKEN_FILE_ENV
from loomfs.wire.meta import StatfsRsp
from loomfs.wire.types import Attr, FileType, Layout

__all__ = ["LOOP_THREAD_NAME", "CachedFile", "LoomFS", "connect", "resolve_mgmtd", "stat_result",
           "with_cluster_token"]

COPY_BLOCK_BYTES = 8 << 20


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


class LoomFS(CallerThreadOps):
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
        super().__init__(address, client_factory)

    # --- namespace ----------------------------------------------------------------------

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
        dir_inode = 0  # the first page's directory: every page comes from it (core.readdir_pages)
        while True:
            entries, more, got = self._run(lambda c, a=after, d=dir_inode: _page(c, top, a, detail, d))  # type: ignore[misc]
            dir_inode = dir_inode or got
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

    def rmtree(self, path: str) -> None:
        self._run(lambda c: c.rmtree(path))

    def rename(self, src: str, dst: str, *, no_replace: bool = False,
               expect: tuple[int, int, int] | None = None) -> None:
        self._run(lambda c: c.rename(src, dst, no_replace=no_replace, expect=expect))

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


async def _page(c: AsyncClient, top: str, after: str, detail: bool, dir_inode: int) -> tuple[list[Any], bool, int]:
    rsp = await c.meta.readdir(top, after, READDIR_PAGE, detail, dir_inode)
    return rsp.entries, rsp.more, rsp.dir_inode


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
