"""What a workload runs against: a LoomFS cluster or any mounted directory (``--compare``).

Both expose the same few file-level calls; ``spec`` is a picklable description so worker
processes can open their own (a LoomFS client is per process).
"""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Iterable
from typing import Any, Protocol

Spec = tuple[str, str]  # ("loomfs", cluster dir or mgmtd address) | ("local", directory)


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
    def cold(self, paths: list[str]) -> BenchTarget: ...
    def close(self) -> None: ...


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
        pass  # a fresh client (``cold``) is how caches are emptied here

    def cold(self, paths: list[str]) -> BenchTarget:
        """A fresh client on the same cluster: its attribute, entry and data caches are empty.
        The caller closes it."""
        return LoomTarget(self.spec[1])

    def close(self) -> None:
        if self._own:
            self.fs.close()

    def __repr__(self) -> str:
        return f"LoomTarget({self.spec[1]})"


class LocalTarget:
    """A directory on a mounted file system; paths are relative to ``root``."""

    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        self.name = f"compare:{self.root}"
        self.spec: Spec = ("local", self.root)
        os.makedirs(self.root, exist_ok=True)

    def _p(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def open(self, path: str, mode: str) -> Any:
        return open(self._p(path), mode)

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
        with open(self._p(path), "wb") as f:
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
                self.drop_cache(p)
            except OSError:
                pass
        return self

    def drop_cache(self, path: str) -> None:
        """Flush and drop ``path`` from the page cache so a read-back measures the device."""
        fd = os.open(self._p(path), os.O_RDONLY)
        try:
            os.fsync(fd)
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)

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
