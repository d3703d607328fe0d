"""Locks as sync points (loomfs.mount.revalidate), without a mount: which client files a
grant reopens and how, what the descriptors sharing one end up holding, and what a name that
went, an unnamed file or a failed close do (scripted files and opens stand in for the
client; the kernel's invalidation is recorded)."""

from __future__ import annotations

import asyncio
import errno
from collections import Counter
from collections.abc import Coroutine
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest

from loomfs.mount import revalidate as rv
from loomfs.mount.edge import Handle
from loomfs.mount.uses import FileUses
from loomfs.mount.writers import WriterOps

T = TypeVar("T")


class _File:
    def __init__(self, inode: int, tag: str, *, fail_close: bool = False, fail_flush: bool = False) -> None:
        self.inode, self.tag = inode, tag
        self.closed = False
        self.flushes = 0
        self.fail_close, self.fail_flush = fail_close, fail_flush

    async def flush(self) -> None:
        self.flushes += 1
        if self.fail_flush:
            raise OSError(errno.ENOSPC, "no space")

    async def close(self) -> None:
        self.closed = True
        if self.fail_close:
            raise OSError(errno.EIO, "meta unreachable")


class _Ops:
    """What revalidate uses of LoomOperations: handles, stats, the client's open, names."""

    def __init__(self, names: dict[str, int], named: set[int]) -> None:
        self.names, self.named = names, named
        self.handles: dict[int, Any] = {}
        self.stats = SimpleNamespace(requests=Counter())
        self._cached: dict[int, Any] = {}
        self.opens: list[tuple[str, str]] = []
        self.client = SimpleNamespace(open=self._open)
        self.inodes = SimpleNamespace(has_name=lambda inode: inode in self.named)
        self.uses = FileUses(lambda f: f.close())
        self._stale_names: dict[int, str] = {}  # as LoomOperations makes them
        self._reader_locks: dict[int, Any] = {}

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return await coro

    def _inode_path(self, inode: int) -> str:
        return f"/f{inode}"

    async def _open(self, path: str, mode: str) -> _File:
        self.opens.append((path, mode))
        if path not in self.names:
            raise FileNotFoundError(errno.ENOENT, "gone", path)
        return _File(self.names[path], f"new-{mode}")

    async def _synced_locked(self, h: Handle, *, close: bool = False) -> None:
        assert close
        await h.file.close()

    def _prefetcher(self, f: Any) -> None:
        return None

    _keep_error = WriterOps._keep_error


@pytest.fixture()
def kernel(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    dropped: list[int] = []

    def invalidate(inode: int, attr_only: bool) -> None:
        assert not attr_only
        dropped.append(inode)

    monkeypatch.setattr(rv.pyfuse3, "invalidate_inode", invalidate)
    monkeypatch.setattr(rv, "ENABLED", True)
    return dropped


def _handle(ops: _Ops, fh: int, inode: int, f: Any, writable: bool, lock: asyncio.Lock | None = None) -> Handle:
    h = Handle(inode, f, writable, lock=lock or asyncio.Lock())
    ops.handles[fh] = h
    return h


def test_a_grant_reopens_each_client_file_once_for_the_descriptors_sharing_it(kernel: list[int]) -> None:
    async def main() -> None:
        ops = _Ops({"/f5": 5, "/f6": 6}, {5, 6})
        shared, ro, other = _File(5, "w"), _File(5, "r"), _File(6, "w6")
        lock = asyncio.Lock()
        w1 = _handle(ops, 1, 5, shared, True, lock)
        w2 = _handle(ops, 2, 5, shared, True, lock)
        r = _handle(ops, 3, 5, ro, False)
        o = _handle(ops, 4, 6, other, True)
        ops._cached[5] = (1, 2, 3)
        await rv.revalidate(ops, 5)
        assert sorted(ops.opens) == [("/f5", "r+b"), ("/f5", "rb")]
        assert w1.file is w2.file and w1.file.tag == "new-r+b" and not w1.file.closed
        assert r.file.tag == "new-rb" and shared.closed and ro.closed
        assert o.file is other and not other.closed  # another inode: untouched
        assert kernel == [5] and 5 not in ops._cached
        assert ops.stats.requests["lock_revalidations"] == 1 and ops.stats.requests["lock_reopens"] == 2

    asyncio.run(main())


def test_a_name_that_leads_elsewhere_leaves_the_write_file_closed_and_the_reader_as_it_was(kernel: list[int]) -> None:
    async def main() -> None:
        ops = _Ops({"/f5": 9}, {5})  # another node renamed another file over the name
        w, ro = _File(5, "w"), _File(5, "r")
        hw = _handle(ops, 1, 5, w, True)
        hr = _handle(ops, 2, 5, ro, False)
        await rv.revalidate(ops, 5)
        assert hw.file is w and w.closed  # its next use opens the name again (_usable: ENOENT)
        assert hr.file is ro and not ro.closed
        assert ops.stats.requests["lock_reopens"] == 0 and kernel == [5]

        gone = _Ops({}, {5})  # unlinked by another node
        w2 = _File(5, "w")
        _handle(gone, 1, 5, w2, True)
        await rv.revalidate(gone, 5)
        assert w2.closed and gone.stats.requests["lock_revalidate_errors"] == 1

    asyncio.run(main())


def test_a_file_without_a_name_here_is_not_reopened(kernel: list[int]) -> None:
    async def main() -> None:
        ops = _Ops({"/f5": 5}, set())  # its last name went: the write session keeps it at meta
        w = _File(5, "w")
        h = _handle(ops, 1, 5, w, True)
        await rv.revalidate(ops, 5)
        assert h.file is w and not w.closed and ops.opens == []
        assert kernel == [5]  # the kernel's pages still go

    asyncio.run(main())


def test_a_failed_close_is_counted_and_the_file_reopened(kernel: list[int]) -> None:
    async def main() -> None:
        ops = _Ops({"/f5": 5}, {5})
        w = _File(5, "w", fail_close=True)
        h = _handle(ops, 1, 5, w, True)
        await rv.revalidate(ops, 5)
        assert h.file.tag == "new-r+b" and ops.stats.requests["lock_revalidate_errors"] == 1

    asyncio.run(main())


def test_flush_before_the_request_sends_each_write_file_once_and_raises_its_error(kernel: list[int]) -> None:
    async def main() -> None:
        ops = _Ops({}, {5})
        shared, ro = _File(5, "w"), _File(5, "r")
        lock = asyncio.Lock()
        _handle(ops, 1, 5, shared, True, lock)
        _handle(ops, 2, 5, shared, True, lock)
        _handle(ops, 3, 5, ro, False)
        await rv.flush_writers(ops, 5)
        assert shared.flushes == 1 and ro.flushes == 0
        shared.fail_flush = True
        with pytest.raises(OSError) as err:
            await rv.flush_writers(ops, 5)
        assert err.value.errno == errno.ENOSPC
        # the descriptors keep it for their next fsync or close(2); the read-only one has none
        assert ops.handles[1].error is err.value and ops.handles[2].error is err.value
        assert ops.handles[3].error is None

    asyncio.run(main())


def test_switched_off_nothing_is_sent_or_reopened(kernel: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rv, "ENABLED", False)

    async def main() -> None:
        ops = _Ops({"/f5": 5}, {5})
        w = _File(5, "w")
        _handle(ops, 1, 5, w, True)
        await rv.flush_writers(ops, 5)
        await rv.revalidate(ops, 5)
        assert w.flushes == 0 and not w.closed and ops.opens == [] and kernel == []

    asyncio.run(main())
