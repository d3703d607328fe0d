"""The mount's read holds (loomfs.mount.holds): bookkeeping, and what a renewal that finds
holds gone does (no sockets: a scripted meta stands in for the RPCs the renewal makes)."""

from __future__ import annotations

import asyncio
import errno
from typing import Any

import pytest

from loomfs.mount.edge import Handle
from loomfs.mount.holds import HoldOps, Holds, new_hold_id
from loomfs.mount.inodes import InodeTable


def test_hold_ids_are_client_range_and_distinct() -> None:
    ids = {new_hold_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(1 << 62 <= i < 1 << 63 for i in ids)  # meta's own session ids are below 1 << 62


def test_holds_are_kept_until_popped_and_overdue_after_half_a_lease() -> None:
    now = [100.0]
    h = Holds(clock=lambda: now[0])
    h.lease_s = 60.0
    assert not h.overdue()  # none held
    h.add(5, 100)
    h.add(3, 101)
    assert len(h) == 2 and h.ids() == [3, 5] and h.items() == [(3, 101), (5, 100)] and 5 in h
    now[0] += 29
    assert not h.overdue()
    now[0] += 2
    assert h.overdue()
    h.renewed_at = now[0]
    assert not h.overdue()
    assert h.pop(5) == 100 and h.pop(5) is None
    assert h.ids() == [3] and "held=1 taken_total=2" in repr(h)


class _Meta:
    """Answers RENEW_SESSIONS from a set of the ids meta still has, and OPENs by path."""

    def __init__(self, alive: set[int], names: dict[str, int]) -> None:
        self.alive, self.names = alive, names

    async def renew_sessions(self, client_id: int, ids: list[int]) -> int:
        return sum(1 for i in ids if i in self.alive)

    async def open(self, path: str, flags: int, mode: int, client_id: int, hold_id: int) -> Any:
        from loomfs.wire.meta import OpenRsp
        from loomfs.wire.types import Attr

        if path not in self.names:
            raise FileNotFoundError(errno.ENOENT, "gone", path)
        self.alive.add(hold_id)
        return OpenRsp(attr=Attr(inode=self.names[path], type=1))


class _File:
    def __init__(self, inode: int) -> None:
        from loomfs.wire.types import Attr

        self.inode, self.inline, self.path = inode, False, f"/f{inode}"
        self.opened_attr = Attr(inode=inode, type=1)


class _Ops(HoldOps):
    def __init__(self, meta: _Meta) -> None:
        self.client: Any = type("C", (), {"meta": meta, "client_id": 7})()
        self.holds = Holds()
        self.handles = {}
        self.inodes = InodeTable()
        self._renew_task = None
        self._renewing = None

    async def call(self, coro: Any) -> Any:
        return await coro


def test_a_lapsed_hold_is_taken_again_by_name_or_its_reads_answer_eio() -> None:
    async def go() -> None:
        meta = _Meta(alive={11, 12}, names={"/kept": 20})
        ops = _Ops(meta)
        ops.inodes.remember(20, "/kept")  # still named: its hold is taken again
        ops.inodes.remember(21, "/gone")  # its name went elsewhere meanwhile (meta: no such path)
        for fh, (hold_id, inode) in enumerate(((11, 20), (12, 21))):
            ops.holds.add(hold_id, inode)
            ops.handles[fh] = Handle(inode, _File(inode), False, hold_id=hold_id)  # type: ignore[arg-type]
        meta.alive.clear()  # the mount was away past the lease: meta expired both
        ops.holds.renewed_at -= ops.holds.lease_s  # overdue
        kept, gone = ops.handles[0], ops.handles[1]
        assert isinstance(kept, Handle) and isinstance(gone, Handle)
        await ops._check_holds(kept)  # a read renews first, and finds out
        assert kept.hold_id not in (0, 11) and kept.hold_id in ops.holds and not kept.lost
        assert gone.lost and gone.hold_id == 0 and ops.holds.lost_total == 2
        with pytest.raises(OSError) as ei:
            await ops._check_holds(gone)
        assert ei.value.errno == errno.EIO
        assert not ops.holds.overdue()
        if ops._renew_task is not None:
            ops._renew_task.cancel()

    asyncio.run(go())
