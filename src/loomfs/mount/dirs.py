"""A directory listed through the mount a page at a time (the I/O is passed in).

FUSE's readdir asks for entries from an offset: the offset of entry ``i`` (from 0, in name
order) is ``i + 1`` and the next call resumes at the last offset the kernel took. One opendir
holds a ``DirStream``: the page holding the current offset, the iterator that reads the pages
after it, and the name cursor each page started after (so a ``seekdir`` back, or a
``rewinddir``, reads from the nearest page start again). The kernel's resume inside the
entries just before the current page (a READDIR reply that crossed a page boundary, of which
a small getdents buffer took only part) is answered from memory (``back``): listed again,
names made or removed meanwhile would move the positions (session 15). A huge directory
streams: memory is two pages (at least ``BACK_ENTRIES`` entries) plus one name per page.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from loomfs.wire.types import DirEntry

Pages = AsyncIterator[list[DirEntry]]
BACK_ENTRIES = 512  # kept before the current page, at least (more than a READDIR reply holds)


async def _next_page(pages: Pages) -> list[DirEntry] | None:
    try:
        return await pages.__anext__()
    except StopAsyncIteration:
        return None


async def _close(pages: Pages) -> None:
    aclose = getattr(pages, "aclose", None)
    if aclose is not None:
        await aclose()


@dataclass(eq=False)
class DirStream:
    path: str
    pages_after: Callable[[str], Pages]  # name cursor -> the directory's pages after it
    run: Callable[[Coroutine[Any, Any, Any]], Awaitable[Any]] = field(repr=False)  # on the client's loop
    base: int = 0  # offset of page[0]
    page: list[DirEntry] = field(default_factory=list, repr=False)
    starts: dict[int, str] = field(default_factory=dict, repr=False)  # page offset -> cursor before it
    pages: Pages | None = field(default=None, repr=False)  # None: not started or read to the end
    inode: int = 0  # the directory's
    # every name so far of a listing read from the start page after page (None after a
    # seekdir elsewhere); ``complete`` once it reached the end: loomfs.mount.names
    names: set[str] | None = field(default=None, repr=False)
    complete: bool = False
    listing: tuple[float, set[str]] | None = None  # (monotonic time, AbsentNames token) at its start
    # the entries just before ``base`` (at least one page's worth): the kernel resumes inside
    # them when a reader's getdents buffer took only part of a READDIR reply that crossed
    # into the next page (it drops the rest and asks again from the last entry it handed out,
    # never before ``replied_from``, the first entry of the last READDIR answered)
    back: list[DirEntry] = field(default_factory=list, repr=False)
    replied_from: int = sys.maxsize  # set by the READDIR handler; a direct page_at leaves it
    # the path ``pages`` lists: the handler sets ``path`` to the directory's name now (renamed
    # since the opendir), and the next page is asked by it, after the last name listed
    listed_path: str = field(default="", repr=False)
    # the last page asked failed (meta's error, or this directory's path leading to another
    # one now): the pages iterator ended with it, so the next call asks again from the cursor
    # instead of taking the dead iterator's end for the directory's
    failed: bool = field(default=False, repr=False)

    def __repr__(self) -> str:
        return f"DirStream({self.path!r}, base={self.base}, page={len(self.page)}, pages_seen={len(self.starts)})"

    async def page_at(self, offset: int, *, rewind: bool = False) -> tuple[int, list[DirEntry]]:
        """``(base, page)`` with ``base <= offset < base + len(page)``; an empty page past the end.
        ``rewind``: the kernel asked from the very start (a first READDIR, or ``rewinddir``); a
        READDIR right after "." and ".." asks for entry 0 too but continues the listing."""
        if rewind or not self.starts:
            await self._restart(0)  # first readdir, or rewinddir: a fresh listing
        elif max(self.replied_from, self.base - len(self.back)) <= offset < self.base:
            # from memory: listed again from a page start, the positions would have moved
            # with every name made or removed before them since (a name listed twice, or
            # one that existed throughout skipped)
            return self.base - len(self.back), self.back + self.page
        elif not self.base <= offset <= self.base + len(self.page):
            await self._restart(max(s for s in self.starts if s <= offset))  # seekdir
        while offset >= self.base + len(self.page):
            if self.failed or (self.pages is not None and self.listed_path != self.path):
                # a failed page is asked again; renamed since these pages were asked for: the
                # old path is another directory's now, or nothing's (session 15 review)
                await self.close()
                self.pages = self.pages_after(self.page[-1].name if self.page else self.starts[self.base])
                self.listed_path = self.path
                self.failed = False
            try:
                nxt = await self.run(_next_page(self.pages)) if self.pages is not None else None
            except BaseException:
                self.failed = True
                raise
            if nxt is None:
                await self.close()
                self.complete = self.names is not None
                return offset, []
            before = self.page[-1].name if self.page else self.starts[self.base]
            self.back = (self.back + self.page)[-max(BACK_ENTRIES, len(self.page)):]
            self.base += len(self.page)
            self.page = nxt
            if self.names is not None:
                self.names.update(e.name for e in nxt)
            self.starts.setdefault(self.base, before)
        return self.base, self.page

    async def _restart(self, base: int) -> None:
        await self.close()
        self.failed = False
        self.names, self.complete = (set() if base == 0 else None), False
        if base == 0:
            self.starts = {0: ""}
        self.base, self.page, self.back = base, [], []
        self.pages = self.pages_after(self.starts[base])
        self.listed_path = self.path

    async def close(self) -> None:
        pages, self.pages = self.pages, None
        if pages is not None:
            await self.run(_close(pages))
