"""Where shards and files live: a local directory or LoomFS, behind one small seam.

``location("loom://HOST:PORT/path")`` -> ``(LoomStore, "/path")``; ``"loom:///path"`` or
``"loom:/path"`` use the given address or ``$LOOMFS_CLUSTER`` (so does ``loom://a/b``, an
authority without a port being the path's first part, as ``loomfs.fsspec`` reads it);
``"file:/path"`` and ``pathlib.Path`` objects are local; a bare string is whatever ``default``
says.

A ``LoomStore`` pickles as its address only: the client is looked up per process on first
use (``LoomFS`` itself starts a fresh loop after a fork), so datasets holding stores can go
to DataLoader workers by fork or spawn.
"""

from __future__ import annotations

import os
import posixpath
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from pathlib import PurePath
from typing import TYPE_CHECKING, Any, BinaryIO

if TYPE_CHECKING:
    from loomfs.client.sync import LoomFS

_GLOB_CHARS = re.compile(r"[*?\[]")
_clients: dict[str, LoomFS] = {}
_clients_lock = threading.Lock()


def _reset_lock() -> None:
    global _clients_lock
    _clients_lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_lock)


def client(address: str | None) -> LoomFS:
    """This process's shared client of ``address`` (None: ``$LOOMFS_CLUSTER``)."""
    key = address or ""
    fs = _clients.get(key)
    if fs is not None and not fs.closed:
        return fs
    with _clients_lock:
        fs = _clients.get(key)
        if fs is None or fs.closed:
            import loomfs

            fs = loomfs.connect(address)
            _clients[key] = fs
        return fs


def close_clients() -> None:
    """Close this process's shared clients (a CLI command's end, a test module's teardown);
    the next use connects again."""
    with _clients_lock:
        clients = list(_clients.values())
        _clients.clear()
    for fs in clients:
        fs.close()


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A glob as a regex over whole paths: ``*`` and ``?`` stay within one path segment,
    ``**/`` matches any number of directories, ``[...]`` is a character class."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            j = pattern.find("]", i + 2 if pattern.startswith("[!", i) else i + 1)
            if j < 0:
                out.append(re.escape(c))
                i += 1
                continue
            body = pattern[i + 1:j]
            if body.startswith("!"):
                body = "^" + body[1:]
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = j + 1
        else:
            out.append(re.escape(c))
            i += 1
    return re.compile("".join(out) + r"\Z", re.DOTALL)


def is_glob(path: str) -> bool:
    return bool(_GLOB_CHARS.search(path))


class Store(ABC):
    """The few primitives the shard code needs; listing and globbing are written once here
    above ``walk``."""

    kind = "store"

    @abstractmethod
    def open_read(self, path: str) -> BinaryIO:
        ...

    @abstractmethod
    def open_write(self, path: str) -> BinaryIO:
        ...

    def read_bytes(self, path: str) -> bytes:
        with self.open_read(path) as f:
            return f.read()

    def read_many(self, paths: Sequence[str]) -> list[bytes | OSError]:
        out: list[bytes | OSError] = []
        for p in paths:
            try:
                out.append(self.read_bytes(p))
            except OSError as exc:
                out.append(exc)
        return out

    def write_many(self, items: dict[str, bytes]) -> None:
        for p, data in items.items():
            with self.open_write(p) as f:
                f.write(data)

    @abstractmethod
    def walk(self, top: str) -> Iterator[tuple[str, list[str], list[str]]]:
        ...

    @abstractmethod
    def size(self, path: str) -> int:
        ...

    @abstractmethod
    def exists(self, path: str) -> bool:
        ...

    @abstractmethod
    def isdir(self, path: str) -> bool:
        ...

    @abstractmethod
    def makedirs(self, path: str) -> None:
        ...

    @abstractmethod
    def rename(self, src: str, dst: str) -> None:
        ...

    @abstractmethod
    def remove(self, path: str) -> None:
        ...

    def join(self, *parts: str) -> str:
        return posixpath.join(*parts)

    def url(self, path: str) -> str:
        return path

    # --- derived ----------------------------------------------------------------------------

    def files_under(self, top: str) -> list[str]:
        """Every file below ``top``, sorted."""
        out: list[str] = []
        for d, _dirs, files in self.walk(top):
            out.extend(self.join(d, f) for f in files)
        out.sort()
        return out

    def glob(self, pattern: str) -> list[str]:
        """Files matching ``pattern`` (see ``glob_regex``), sorted; only the directories the
        pattern can reach are listed."""
        parts = pattern.split("/")
        fixed = 0
        while fixed < len(parts) - 1 and not is_glob(parts[fixed]):
            fixed += 1
        base = "/".join(parts[:fixed]) or ("/" if pattern.startswith("/") else ".")
        rest = parts[fixed:]
        max_depth = None if any("**" in p for p in rest) else len(rest) - 1
        rx = glob_regex(pattern)
        out: list[str] = []
        if not self.isdir(base):
            return out
        base_depth = base.rstrip("/").count("/")
        for d, dirs, files in self.walk(base):
            depth = d.rstrip("/").count("/") - base_depth
            if max_depth is not None and depth >= max_depth:
                dirs[:] = []
            if max_depth is not None and depth != max_depth:
                continue
            for f in files:
                full = self.join(d, f)
                if base == "." and full.startswith("./"):
                    full = full[2:]
                if rx.match(full):
                    out.append(full)
        out.sort()
        return out

    def expand(self, source: str | Sequence[str]) -> list[str]:
        """File paths from a directory (every file below it), a glob, one file, or a list of
        files (taken as they are, not checked: a million stats would cost more than reads)."""
        if not isinstance(source, str):
            return [str(p) for p in source]
        if is_glob(source):
            found = self.glob(source)
            if not found:
                raise FileNotFoundError(f"no files match {self.url(source)}")
            return found
        if self.isdir(source):
            return self.files_under(source)
        if not self.exists(source):
            raise FileNotFoundError(2, "No such file or directory", self.url(source))
        return [source]


class LocalStore(Store):
    kind = "file"

    def open_read(self, path: str) -> BinaryIO:
        return open(path, "rb")

    def open_write(self, path: str) -> BinaryIO:
        return open(path, "wb")

    def walk(self, top: str) -> Iterator[tuple[str, list[str], list[str]]]:
        for d, dirs, files in os.walk(top):
            dirs.sort()
            yield d, dirs, files

    def size(self, path: str) -> int:
        return os.path.getsize(path)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def isdir(self, path: str) -> bool:
        return os.path.isdir(path)

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def rename(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def remove(self, path: str) -> None:
        os.unlink(path)

    def join(self, *parts: str) -> str:
        return os.path.join(*parts)

    def url(self, path: str) -> str:
        return "file:" + os.path.abspath(path)

    def __repr__(self) -> str:
        return "LocalStore()"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LocalStore)

    def __hash__(self) -> int:
        return hash("file")


class LoomStore(Store):
    kind = "loom"

    def __init__(self, address: str | None = None):
        self.address = address

    @property
    def fs(self) -> LoomFS:
        return client(self.address)

    def open_read(self, path: str) -> BinaryIO:
        f: BinaryIO = self.fs.open(path, "rb")
        return f

    def open_write(self, path: str) -> BinaryIO:
        f: BinaryIO = self.fs.open(path, "wb")
        return f

    def read_bytes(self, path: str) -> bytes:
        return self.fs.cat(path)

    def read_many(self, paths: Sequence[str]) -> list[bytes | OSError]:
        return self.fs.read_many(paths)

    def write_many(self, items: dict[str, bytes]) -> None:
        for p, err in zip(items, self.fs.put_many(items), strict=True):
            if err is not None:
                raise err if err.filename else type(err)(err.errno, err.strerror, p)

    def walk(self, top: str) -> Iterator[tuple[str, list[str], list[str]]]:
        for d, dirs, files in self.fs.walk(top):
            dirs.sort()
            yield d, dirs, files

    def size(self, path: str) -> int:
        return int(self.fs.stat(path).st_size)

    def exists(self, path: str) -> bool:
        return self.fs.exists(path)

    def isdir(self, path: str) -> bool:
        return self.fs.isdir(path)

    def makedirs(self, path: str) -> None:
        self.fs.makedirs(path, exist_ok=True)

    def rename(self, src: str, dst: str) -> None:
        self.fs.rename(src, dst)

    def remove(self, path: str) -> None:
        self.fs.unlink(path)

    def url(self, path: str) -> str:
        """``loom://HOST:PORT/path``, or ``loom:///path`` when the cluster is a local
        directory or ``$LOOMFS_CLUSTER``."""
        host = self.address if self.address and not os.path.isabs(self.address) else ""
        return f"loom://{host}{path if path.startswith('/') else '/' + path}"

    def __getstate__(self) -> dict[str, Any]:
        return {"address": self.address}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.address = state["address"]

    def __repr__(self) -> str:
        return f"LoomStore({self.address!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LoomStore) and other.address == self.address

    def __hash__(self) -> int:
        return hash(("loom", self.address))


def location(source: str | os.PathLike[str], address: str | None = None, *,
             default: str = "loom") -> tuple[Store, str]:
    """Split a path or URL into its store and the path inside it (see the module doc)."""
    if isinstance(source, os.PathLike | PurePath):
        return LocalStore(), os.fspath(source)
    text = str(source)
    if text.startswith("loom://"):
        rest = text[len("loom://"):]
        host, slash, path = rest.partition("/")
        if host and ":" not in host:  # no port: not a cluster but the path's first part (as fsspec reads it)
            return LoomStore(address), "/" + rest
        return LoomStore(host or address), "/" + path if slash else "/"
    if text.startswith("loom:"):
        return LoomStore(address), "/" + text[len("loom:"):].lstrip("/")
    if text.startswith("file://"):
        return LocalStore(), text[len("file://"):] or "/"
    if text.startswith("file:"):
        return LocalStore(), text[len("file:"):]
    if default == "loom":
        return LoomStore(address), text
    if default == "file":
        return LocalStore(), text
    raise ValueError(f"default must be 'loom' or 'file', not {default!r}")
