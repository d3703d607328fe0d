"""A load's batches bound the reader's own buffers (scratch tensors, bytes items), not the
bytes read: items read straight into their destination tensors are one batch, one hop to the
client's loop, with no pause between batches; items that need scratch still end a batch at
``batch_bytes``, and the files stay held from the first batch to the last. Fakes of meta and
the client (``test_checkpoint_load_holds``), no sockets."""

from __future__ import annotations

import errno
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from test_checkpoint_load_holds import _Client, _LoopFS, _Meta

from loomfs.checkpoint import _reader as R
from loomfs.checkpoint._format import ItemLoc, dtype_name


def _load(dest_dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch, gone: set[str] | None = None
          ) -> tuple[list[int], list[int], dict[str, torch.Tensor], _Client]:
    """Two 16-float items in two files, batch_bytes=1; the batches' sizes (items per
    read_files call) and the holds at each commit."""
    c = _Client()
    names = [f"__0_{i}.distcp" for i in range(2)]
    batches: list[int] = []
    real_read_files = R.read_files

    async def counted(client: Any, reads: dict[str, Any], *a: Any) -> None:
        batches.append(sum(len(v) for v in reads.values()))
        await real_read_files(client, reads, *a)

    monkeypatch.setattr(R, "read_files", counted)
    if gone is not None:
        real_open = _Meta.open

        async def open_unless_gone(self: _Meta, path: str, *a: Any) -> Any:
            if path in gone:
                raise FileNotFoundError(errno.ENOENT, "pruned", path)
            return await real_open(self, path, *a)

        monkeypatch.setattr(_Meta, "open", open_unless_gone)
    fs = _LoopFS(c)
    reader = R.LoomStorageReader("/ck", fs, batch_bytes=1)
    reader.checkpoint_path = "/ck"
    reader.storage_data = {n: ItemLoc(file=n, offset=0, length=64, crc32c=0, dtype=dtype_name(torch.float32),
                                      shape=(16,)) for n in names}
    items = [SimpleNamespace(storage_index=n, type=None, storage_offsets=[0], lengths=[16]) for n in names]
    got = {n: torch.zeros(16, dtype=dest_dtype) for n in names}
    held: list[int] = []

    def commit(item: Any, dest: torch.Tensor) -> None:
        held.append(len(c.meta.holds))
        if gone is not None:
            gone.update(f"/ck/{n}" for n in names)  # pruned after the first commit

    planner = SimpleNamespace(resolve_tensor=lambda item: got[item.storage_index], commit_tensor=commit)
    try:
        reader._read_on_loop(items, planner)
    finally:
        fs.loop.close()
    return batches, held, got, c


def test_items_read_into_their_destinations_are_one_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    batches, held, got, c = _load(torch.float32, monkeypatch)
    assert batches == [2] and held == [2, 2] and not c.meta.holds
    ones = torch.frombuffer(bytearray(b"\1" * 64), dtype=torch.float32)  # what the fake file holds
    assert all(torch.equal(t, ones) for t in got.values())


def test_scratch_ends_a_batch_and_every_file_stays_held_to_the_last(monkeypatch: pytest.MonkeyPatch) -> None:
    """float64 destinations of float32 items: read into scratch, converted at commit. A prune
    after the first batch's commit: the second batch reads the file it holds."""
    batches, held, got, c = _load(torch.float64, monkeypatch, gone=set())
    assert batches == [1, 1] and held == [2, 2] and not c.meta.holds
    ones = torch.frombuffer(bytearray(b"\1" * 64), dtype=torch.float32).double()
    assert all(torch.equal(t, ones) for t in got.values())
