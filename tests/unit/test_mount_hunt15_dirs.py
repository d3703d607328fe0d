"""A directory stream resumed by the kernel inside the page before the current one (no I/O).

The kernel hands a getdents caller what fits of a READDIR reply and drops the rest; the next
READDIR resumes after the last entry it handed out. When the reply crossed into the next
page of the listing, that offset lies before the stream's current page. Listed again from a
page start, names made meanwhile before that offset would shift the positions: a name
listed twice."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from loomfs.mount.dirs import DirStream
from loomfs.wire.types import DirEntry


def test_a_resume_inside_the_previous_page_lists_each_name_once() -> None:
    names = [f"n{i:04d}" for i in range(30)]
    fetched: list[str] = []

    async def pages_after(after: str) -> AsyncIterator[list[DirEntry]]:
        fetched.append(after)
        rest = sorted(n for n in names if n > after)
        for k in range(0, len(rest), 10):
            yield [DirEntry(name=n) for n in rest[k:k + 10]]

    async def run(coro: Coroutine[Any, Any, Any]) -> Any:
        return await coro

    async def readdir(s: DirStream, start: int, count: int) -> list[str]:
        """The mount's READDIR: ``count`` entries from ``start`` (each page as it comes)."""
        out: list[str] = []
        i = start
        base, page = await s.page_at(i, rewind=start == 0)
        s.replied_from = start
        while page and len(out) < count:
            for e in page[i - base:]:
                if len(out) == count:
                    break
                out.append(e.name)
                i += 1
            else:
                base, page = await s.page_at(i)
        return out

    async def scenario() -> list[str]:
        s = DirStream("/d", pages_after, run)
        listed: list[str] = []
        replied = await readdir(s, 0, 14)  # a reply crossing into the second page
        listed += replied[:8]  # the caller's buffer took 8 of them
        names.append("a-new")  # made meanwhile, before all of them
        names.append("n0003x")
        at = 8
        while True:
            replied = await readdir(s, at, 14)
            if not replied:
                break
            listed += replied[:8]
            at += len(replied[:8])
        await s.close()
        return listed

    listed = asyncio.run(scenario())
    assert len(listed) == len(set(listed)), sorted(n for n in set(listed) if listed.count(n) > 1)
    assert set(names) - {"a-new", "n0003x"} <= set(listed)
    assert fetched[0] == ""
