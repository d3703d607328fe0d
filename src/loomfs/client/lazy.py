"""Files opened with "w" that this client has not created yet (``AsyncFile`` lazy creates).

A "w" open is created at close, carrying its bytes (one round trip for a small file). For
this client's own calls that must not show: before a call on a path (stat, open, cat,
rename, unlink, link, a listing of its directory, ...) the pending creates it could see
are made (``create_now``), so a program sees its own "w" files as POSIX says. Other clients
see the file at its close (or fsync), see docs/consistency.md.

The registry is touched on the event loop thread; ``pending`` is also asked from caller
threads (the blocking API's fast paths), a dict lookup.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from loomfs.client.file import AsyncFile


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0] or "/"


class LazyCreates:
    def __init__(self) -> None:
        self._by_path: dict[str, weakref.WeakSet[AsyncFile]] = {}

    def add(self, path: str, f: AsyncFile) -> None:
        self._by_path.setdefault(path, weakref.WeakSet()).add(f)

    def discard(self, path: str, f: AsyncFile) -> None:
        files = self._by_path.get(path)
        if files is not None:
            files.discard(f)
            if not files:
                self._by_path.pop(path, None)

    def __bool__(self) -> bool:
        return bool(self._by_path)

    def pending(self, path: str) -> bool:
        """Whether a create waits on exactly ``path`` (callable from any thread)."""
        return bool(self._by_path) and path in self._by_path

    def _matching(self, paths: tuple[str, ...], *, children: bool, subtree: bool) -> list[AsyncFile]:
        out: list[AsyncFile] = []
        for p, files in list(self._by_path.items()):
            hit = p in paths
            if not hit and children:
                hit = _parent(p) in paths
            if not hit and subtree:
                hit = any(p.startswith(q.rstrip("/") + "/") for q in paths)
            if hit:
                out.extend(files)
        return out

    async def settle(self, *paths: str, children: bool = False, subtree: bool = False) -> None:
        """Create now every pending file at ``paths`` (``children``: also the entries of
        those directories; ``subtree``: anything under them)."""
        if not self._by_path:
            return
        for f in self._matching(paths, children=children, subtree=subtree):
            await f.create_now()

    def __repr__(self) -> str:
        return f"LazyCreates({sum(len(v) for v in self._by_path.values())} pending)"
