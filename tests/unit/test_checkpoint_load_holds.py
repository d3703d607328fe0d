"""A load's read holds (review of 1cf28ef, findings 3-5): taken concurrently for every file of
the load before its first batch and kept to its end; a renewal error within the lease fails
no read; a file close that fails still ends every hold. Fakes of meta and the client, a fake
clock, no sockets, no sleeps. Each test failed on 1cf28ef."""

from __future__ import annotations

import asyncio
import collections
import errno
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from loomfs.checkpoint._format import ItemLoc, dtype_name
from loomfs.checkpoint._holds import HoldLapsed, ReadHolds
from loomfs.checkpoint._reader import LoomStorageReader, read_files


class _File:
    def __init__(self, inode: int, fail_close: bool = False):
        self.layout = SimpleNamespace(chunk_size=4 << 20)
        self.inode = inode
        self.inline = False
        self.fail_close = fail_close

    async def pread(self, offset: int, view: memoryview) -> int:
        view[:] = b"\1" * len(view)
        return len(view)

    async def close(self) -> None:
        if self.fail_close:
            raise OSError(errno.EIO, "close failed")


class _Meta:
    def __init__(self) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        self.holds: dict[int, int] = {}
        self.inflight = 0
        self.most_inflight = 0
        self.gate: asyncio.Event | None = None  # OPENs and CLOSEs wait here until it is set
        self.fail_renew = False

    async def _enter(self) -> None:
        self.inflight += 1
        self.most_inflight = max(self.most_inflight, self.inflight)
        if self.gate is not None:
            if self.inflight >= 8:  # 8 calls in flight at once: the test's proof, then go on
                self.gate.set()
            await self.gate.wait()
        self.inflight -= 1

    async def open(self, path: str, flags: int, mode: int, client_id: int, hold_id: int) -> Any:
        await self._enter()
        self.calls["hold"] += 1
        inode = hash(path) & 0xFFFF
        self.holds[hold_id] = inode
        return SimpleNamespace(attr=SimpleNamespace(inode=inode), session_lease_s=60.0, data=None)

    async def close(self, inode: int, hold_id: int, length: int) -> None:
        await self._enter()
        self.calls["end"] += 1
        self.holds.pop(hold_id, None)

    async def renew_sessions(self, client_id: int, ids: list[int]) -> int:
        self.calls["renew"] += 1
        if self.fail_renew:
            raise OSError(errno.ETIMEDOUT, "meta timed out once")
        return sum(i in self.holds for i in ids)


class _Client:
    def __init__(self, fail_close: bool = False):
        self.meta = _Meta()
        self.client_id = 1
        self.fail_close = fail_close

    async def open(self, path: str, mode: str) -> Any:
        self.meta.calls["open"] += 1
        return _File(hash(path) & 0xFFFF, self.fail_close)


def _reads(n: int) -> dict[str, list[tuple[int, memoryview]]]:
    return {f"/ck/__{i}_0.distcp": [(0, memoryview(bytearray(64)))] for i in range(n)}


def test_holds_are_taken_and_ended_concurrently() -> None:
    c = _Client()

    async def main() -> None:
        c.meta.gate = asyncio.Event()  # serial OPENs would wait here for ever (the timeout below)
        await asyncio.wait_for(read_files(c, _reads(32), 16), timeout=30)

    asyncio.run(main())
    assert c.meta.most_inflight >= 8
    assert c.meta.calls["hold"] == c.meta.calls["end"] == 32 and not c.meta.holds


def test_a_renewal_error_within_the_lease_fails_no_read() -> None:
    c = _Client()
    c.meta.fail_renew = True  # meta times out once, at the end of the reads
    buf = bytearray(64)
    asyncio.run(read_files(c, {"/f": [(0, memoryview(buf))]}, 4))
    assert bytes(buf) == b"\1" * 64 and not c.meta.holds


def test_a_renewal_error_after_the_lease_ran_out_unconfirmed_fails() -> None:
    c = _Client()
    now = [0.0]

    async def main() -> None:
        holds = ReadHolds(c, clock=lambda: now[0])
        await holds.open_all(["/f"])
        now[0] += 61.0  # reads that lasted past the lease, no renewal answered meanwhile
        c.meta.fail_renew = True
        try:
            with pytest.raises(HoldLapsed):
                await read_files(c, {"/f": [(0, memoryview(bytearray(64)))]}, 4, None, holds)
        finally:
            await holds.close()

    asyncio.run(main())


def test_a_failing_file_close_still_ends_the_holds_and_the_renewals() -> None:
    c = _Client(fail_close=True)
    seen: dict[str, Any] = {}

    async def main() -> None:
        with pytest.raises(OSError, match="close failed"):
            await read_files(c, _reads(2), 4)
        seen["tasks"] = [t.get_name() for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    asyncio.run(main())
    assert seen["tasks"] == [] and not c.meta.holds


class _LoopFS:
    """The sync facade's ``run`` and ``client``, on a loop of the test's own."""

    def __init__(self, client: _Client):
        self.client = client
        self.loop = asyncio.new_event_loop()

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)


def test_one_load_holds_every_file_from_its_first_batch_to_its_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """A prune between two batches of a load: the second batch's file must already be held
    (1cf28ef held each batch's files for that batch only: the file was gone when its batch
    opened it)."""
    c = _Client()
    files = {f"__0_{i}.distcp": torch.full((16,), float(i)) for i in range(2)}
    gone: set[str] = set()
    real_open = _Meta.open

    async def open_unless_gone(self: _Meta, path: str, *a: Any) -> Any:
        if path in gone:
            raise FileNotFoundError(errno.ENOENT, "pruned", path)
        return await real_open(self, path, *a)

    monkeypatch.setattr(_Meta, "open", open_unless_gone)
    fs = _LoopFS(c)
    reader = LoomStorageReader("/ck", fs, batch_bytes=1)  # one item per batch
    reader.checkpoint_path = "/ck"
    reader.storage_data = {name: ItemLoc(file=name, offset=0, length=64, crc32c=0, dtype=dtype_name(torch.float32),
                                         shape=[16]) for name in files}
    items = [SimpleNamespace(storage_index=name, type=None, storage_offsets=[0], lengths=[16]) for name in files]
    got: dict[str, torch.Tensor] = {name: torch.zeros(16) for name in files}
    held_at_first_commit: list[int] = []

    def commit(item: Any, dest: torch.Tensor) -> None:
        if not held_at_first_commit:
            held_at_first_commit.append(len(c.meta.holds))
            gone.update(f"/ck/{n}" for n in files)  # pruned between the batches

    planner = SimpleNamespace(resolve_tensor=lambda item: got[item.storage_index], commit_tensor=commit)
    try:
        reader._read_on_loop(items, planner)  # type: ignore[arg-type]
    finally:
        fs.loop.close()
    assert held_at_first_commit == [2] and not c.meta.holds

