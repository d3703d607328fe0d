"""What a workload runs against: a LoomFS cluster or any mounted directory (``--compare``).

Both expose the same few file-level calls; ``spec`` is a picklable description so worker
processes can open their own (a LoomFS client is per process).

Each side says what its acknowledged writes survive (``durability``), and what a cold read
found emptied and what it could not empty (``drop_caches`` returns both lists): the
comparison is only fair when both are printed next to its figures.
"""

from __future__ import annotations

import io
import itertools
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

Spec = tuple[str, str]  # ("loomfs", cluster dir or mgmtd address) | ("local", directory)
Caches = dict[str, list[str]]  # {"dropped": [...], "kept": [...]}: what a cold read starts from

VM_HOST_CACHE = "the VM host's disk cache (cannot be dropped from inside the VM)"


def _fadvise_dontneed(path: str, flush: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        if flush:
            os.fsync(fd)
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


class BenchTarget(Protocol):
    name: str
    spec: Spec

    def open(self, path: str, mode: str) -> Any: ...
    def makedirs(self, path: str) -> None: ...
    def stat(self, path: str) -> Any: ...
    def listdir(self, path: str) -> list[str]: ...
    def list_first(self, path: str, n: int) -> int: ...
    def unlink(self, path: str) -> None: ...
    def rmtree(self, path: str) -> None: ...
    def exists(self, path: str) -> bool: ...
    def write_file(self, path: str, data: bytes | memoryview) -> None: ...
    def read_file(self, path: str) -> bytes: ...
    def create_many(self, paths: Iterable[str]) -> None: ...
    def read_many(self, paths: list[str]) -> list[bytes | OSError]: ...
    def stat_many(self, paths: list[str]) -> list[os.stat_result | OSError]: ...
    def drop_cache(self, path: str) -> None: ...
    def drop_caches(self, path: str) -> Caches: ...
    def cold(self, paths: list[str]) -> BenchTarget: ...
    def cold_caches(self) -> Caches: ...
    def durability(self) -> str: ...
    def close(self) -> None: ...


def meta_durability(where: str) -> str:
    """What meta's store does on commit, read from a local cluster's meta config."""
    import tomllib

    cfgs = sorted(Path(where).glob("meta*/config.toml")) if Path(where).is_dir() else []
    if not cfgs:
        return "as meta's store is configured (not visible from a mgmtd address)"
    cfg = tomllib.loads(cfgs[0].read_text())
    url = str(cfg.get("store_url", "sqlite://"))
    if url.startswith("sqlite"):
        sync = str(cfg.get("sqlite_synchronous", "NORMAL")).upper()
        if sync in ("FULL", "EXTRA"):
            return f"one SQLite file, synchronous={sync}: fsynced on commit, on one host"
        return (f"one SQLite file, synchronous={sync} (WAL): survives a meta process crash, not a power "
                "loss of its host")
    return f"{url.split(':', 1)[0]} (its own durability)"


class LoomTarget:
    """A LoomFS cluster through the blocking client (``loomfs.connect``)."""

    def __init__(self, where: str, fs: Any = None):
        import loomfs

        self.name = "loomfs"
        self.spec: Spec = ("loomfs", where)
        self.fs = fs if fs is not None else loomfs.connect(where)
        self._own = fs is None

    def open(self, path: str, mode: str) -> Any:
        return self.fs.open(path, mode)

    def makedirs(self, path: str) -> None:
        self.fs.makedirs(path, exist_ok=True)

    def stat(self, path: str) -> Any:
        return self.fs.stat(path)

    def listdir(self, path: str) -> list[str]:
        return list(self.fs.listdir(path))

    def list_first(self, path: str, n: int) -> int:
        """Stream the first ``n`` entries (READDIR pages); returns how many came."""
        return sum(1 for _ in itertools.islice(self.fs.iterdir(path), n))

    def unlink(self, path: str) -> None:
        self.fs.unlink(path)

    def rmtree(self, path: str) -> None:
        if self.fs.isdir(path):
            self.fs.rmtree(path)
        elif self.fs.exists(path):
            self.fs.unlink(path)

    def exists(self, path: str) -> bool:
        return bool(self.fs.exists(path))

    def write_file(self, path: str, data: bytes | memoryview) -> None:
        self.fs.pipe(path, data)

    def read_file(self, path: str) -> bytes:
        return bytes(self.fs.cat(path))

    def create_many(self, paths: Iterable[str], inflight: int = 64) -> None:
        """Empty files created ``inflight`` at a time (how a loader fills a directory fast)."""
        import asyncio

        client = self.fs.client
        todo = list(paths)

        async def run() -> None:
            sem = asyncio.Semaphore(inflight)

            async def one(p: str) -> None:
                async with sem:
                    f = await client.open(p, "wb")
                    await f.close()

            await asyncio.gather(*(one(p) for p in todo))

        self.fs.run(run())

    def read_many(self, paths: list[str]) -> list[bytes | OSError]:
        """One batch call: per-item bytes, or the OSError for that item."""
        return list(self.fs.read_many(paths))

    def stat_many(self, paths: list[str]) -> list[os.stat_result | OSError]:
        return list(self.fs.stat_many(paths))

    def drop_cache(self, path: str) -> None:
        self.drop_caches(path)

    def _chunk_dirs(self) -> list[Path]:
        root = Path(self.spec[1])
        return sorted(root.glob("storage*/target*")) if root.is_dir() else []

    def drop_caches(self, path: str) -> Caches:
        """Drop the storage nodes' page cache of every chunk file, where the cluster's target
        directories are on this host (a local cluster); a fresh client (``cold``) empties the
        client's caches. Returns what was dropped and what stays warm."""
        dirs = self._chunk_dirs()
        files = 0
        for d in dirs:
            for dirpath, _dirs, names in os.walk(d):
                for name in names:
                    try:
                        _fadvise_dontneed(os.path.join(dirpath, name))
                        files += 1
                    except OSError:
                        pass
        dropped = ["the LoomFS client's attribute, entry, read-ahead and data caches (a fresh client)"]
        kept = [VM_HOST_CACHE]
        if dirs:
            dropped.append(f"the storage nodes' page cache of all {files} chunk files (posix_fadvise DONTNEED)")
        else:
            kept.insert(0, "the storage nodes' page cache (a remote cluster: not reachable from here; "
                           "big reads use O_DIRECT and skip it)")
        return {"dropped": dropped, "kept": kept}

    def cold(self, paths: list[str]) -> BenchTarget:
        """A fresh client on the same cluster: its attribute, entry and data caches are empty.
        The caller closes it."""
        return LoomTarget(self.spec[1])

    def cold_caches(self) -> Caches:
        """What ``cold`` empties and what it leaves warm (it drops nothing on the servers)."""
        return {"dropped": ["the LoomFS client's attribute, entry and data caches (a fresh client)"],
                "kept": ["meta's SQLite cache and the page cache of its database (inline small files live there)",
                         "the storage nodes' page cache", VM_HOST_CACHE]}

    def durability(self) -> str:
        from loomfs.cli.common import storage_fsync_settings

        fsyncs = storage_fsync_settings(self.spec[1])
        if fsyncs is not None and all(fsyncs):
            text = "chunk data durable: acked after every replica fsynced (fsync_on_commit = true)"
        elif fsyncs is not None:
            text = ("chunk data replicated in memory: acked once every replica holds it in its page cache "
                    "(fsync_on_commit = false): survives R-1 host failures, not a power loss of all replicas")
        else:
            text = ("chunk data acked by every replica; on disk only where storage runs with "
                    "fsync_on_commit = true (not visible from a mgmtd address)")
        return text + "; metadata and inline small files: " + meta_durability(self.spec[1])

    def close(self) -> None:
        if self._own:
            self.fs.close()

    def __repr__(self) -> str:
        return f"LoomTarget({self.spec[1]})"


class _FsyncOnClose(io.FileIO):
    """A file written for the comparison: data written to it is fsynced before it closes
    (what LoomFS's durable mode does before a close returns). An empty create is not."""

    _wrote = False

    def write(self, b: Any) -> int:
        self._wrote = True
        return super().write(b)

    def close(self) -> None:
        if not self.closed and self._wrote:
            os.fsync(self.fileno())
        super().close()


class LocalTarget:
    """A directory on a mounted file system; paths are relative to ``root``. Written files
    are fsynced before they close (``durable``, the default), like LoomFS's durable mode.
    ``drop_dirs``: directories on this host whose files a cold read also drops from the page
    cache, e.g. the chunk directories of a DFS's chunk servers running here (MooseFS's
    ``hdd`` directories: they read their chunk files through this host's page cache, as a
    local LoomFS cluster's storage page cache is dropped for LoomFS's cold reads)."""

    def __init__(self, root: str, durable: bool = True, drop_dirs: Iterable[str] = ()):
        self.root = os.path.abspath(root)
        self.name = f"compare:{self.root}"
        self.spec: Spec = ("local", self.root)
        self.durable = durable
        self.drop_dirs = [os.path.abspath(d) for d in drop_dirs]
        os.makedirs(self.root, exist_ok=True)

    def _drop_dirs(self) -> int:
        """Drop every file under ``drop_dirs`` from the page cache; how many files."""
        files = 0
        for d in self.drop_dirs:
            for dirpath, _dirs, names in os.walk(d):
                for name in names:
                    try:
                        _fadvise_dontneed(os.path.join(dirpath, name))
                        files += 1
                    except OSError:
                        pass
        return files

    def _dropped_dirs_text(self, files: int | None) -> list[str]:
        if not self.drop_dirs:
            return []
        what = "every file" if files is None else f"all {files} files"
        return [f"the page cache of {what} under {', '.join(self.drop_dirs)} (posix_fadvise DONTNEED)"]

    def _p(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def open(self, path: str, mode: str) -> Any:
        if self.durable and mode[:1] in ("w", "a", "x") and "+" not in mode:
            buffered = io.BufferedWriter(_FsyncOnClose(self._p(path), mode.replace("b", "")))
            return buffered if "b" in mode else io.TextIOWrapper(buffered)
        return open(self._p(path), mode)

    def durability(self) -> str:
        if self.durable:
            return ("fsync before close: the data is on this host's disk (survives a power loss; "
                    "directory entries of creates and unlinks are not fsynced)")
        return "page cache only (not fsynced)"

    def makedirs(self, path: str) -> None:
        os.makedirs(self._p(path), exist_ok=True)

    def stat(self, path: str) -> Any:
        return os.stat(self._p(path))

    def listdir(self, path: str) -> list[str]:
        return os.listdir(self._p(path))

    def list_first(self, path: str, n: int) -> int:
        with os.scandir(self._p(path)) as it:
            return sum(1 for _ in itertools.islice(it, n))

    def unlink(self, path: str) -> None:
        os.unlink(self._p(path))

    def rmtree(self, path: str) -> None:
        p = self._p(path)
        if os.path.isdir(p):
            shutil.rmtree(p, ignore_errors=True)
        elif os.path.lexists(p):
            os.unlink(p)

    def exists(self, path: str) -> bool:
        return os.path.exists(self._p(path))

    def write_file(self, path: str, data: bytes | memoryview) -> None:
        with self.open(path, "wb") as f:
            f.write(data)

    def read_file(self, path: str) -> bytes:
        with open(self._p(path), "rb") as f:
            return f.read()

    def create_many(self, paths: Iterable[str]) -> None:
        for p in paths:
            os.close(os.open(self._p(p), os.O_WRONLY | os.O_CREAT, 0o644))

    def read_many(self, paths: list[str]) -> list[bytes | OSError]:
        out: list[bytes | OSError] = []
        for p in paths:
            try:
                out.append(self.read_file(p))
            except OSError as exc:
                out.append(exc)
        return out

    def stat_many(self, paths: list[str]) -> list[os.stat_result | OSError]:
        out: list[os.stat_result | OSError] = []
        for p in paths:
            try:
                out.append(os.stat(self._p(p)))
            except OSError as exc:
                out.append(exc)
        return out

    def cold(self, paths: list[str]) -> BenchTarget:
        """This directory with ``paths`` flushed and dropped from the page cache (best effort:
        the kernel's dentry and inode caches stay warm; a file system that refuses fsync or
        fadvise keeps its cache). Closing it is a no-op."""
        for p in paths:
            try:
                _fadvise_dontneed(self._p(p), flush=True)
            except OSError:
                pass
        self._drop_dirs()
        return self

    def cold_caches(self) -> Caches:
        """What ``cold`` empties and what it leaves warm."""
        return {"dropped": ["this host's page cache of each file (fsync, posix_fadvise DONTNEED)",
                            *self._dropped_dirs_text(None)],
                "kept": ["the kernel's dentry and inode caches",
                         "a network file system client's own cache beyond the page cache (e.g. mfsmount's)",
                         VM_HOST_CACHE]}

    def drop_cache(self, path: str) -> None:
        """Flush and drop ``path`` (and the files under ``drop_dirs``) from the page cache so
        a read-back measures the device."""
        _fadvise_dontneed(self._p(path), flush=True)
        self._drop_dirs()

    def drop_caches(self, path: str) -> Caches:
        """``drop_cache`` and what it leaves warm. A network file system mounted here (FUSE:
        MooseFS, JuiceFS, ...) loses its kernel page cache for the file; a cache of its own
        client process stays unless it honours the fadvise."""
        _fadvise_dontneed(self._p(path), flush=True)
        files = self._drop_dirs()
        return {"dropped": ["this host's page cache of the file (fsync, posix_fadvise DONTNEED)",
                            *self._dropped_dirs_text(files)],
                "kept": ["the kernel's dentry and inode caches",
                         "a network file system client's own cache beyond the page cache (e.g. mfsmount's)",
                         VM_HOST_CACHE]}

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"LocalTarget({self.root})"


def open_target(spec: Spec) -> BenchTarget:
    kind, where = spec
    if kind == "loomfs":
        return LoomTarget(where)
    if kind == "local":
        return LocalTarget(where)
    raise ValueError(f"unknown bench target kind {kind!r}")
