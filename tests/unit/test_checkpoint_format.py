"""Raw tensor bytes and the split of a rank's items into files, without a cluster."""

from __future__ import annotations

import torch
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    MetadataIndex,
    TensorProperties,
)
from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

from loomfs.checkpoint._format import dtype_name, dtype_of, tensor_bytes
from loomfs.checkpoint._writer import split_items


def test_tensor_bytes_share_memory_for_every_dtype() -> None:
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool, torch.complex64):
        t = torch.ones(3, 5, dtype=dtype)
        view = tensor_bytes(t)
        assert len(view) == t.numel() * t.element_size()
        view[:] = bytes(len(view))  # writes land in the tensor (readinto relies on it)
        assert not t.any() and dtype_of(dtype_name(dtype)) is dtype
    assert len(tensor_bytes(torch.empty(0))) == 0 and len(tensor_bytes(torch.tensor(7))) == 8


def _item(name: str, n: int) -> WriteItem:
    return WriteItem(index=MetadataIndex(name), type=WriteItemType.TENSOR, tensor_data=TensorWriteData(
        chunk=ChunkStorageMetadata(offsets=torch.Size([0]), sizes=torch.Size([n])),
        properties=TensorProperties(dtype=torch.float32), size=torch.Size([n])))


def test_split_items_balances_bytes() -> None:
    items = [_item(f"t{i}", n) for i, n in enumerate([1000, 10, 600, 400, 5, 990])]
    groups = split_items(items, 3)
    sizes = sorted(sum(i.tensor_data.size[0] for i in g if i.tensor_data) for g in groups)
    assert sizes == [1000, 1000, 1005]
    assert split_items(items[:1], 4) == [[items[0]]] and split_items([], 4) == []
    byte_item = WriteItem(index=MetadataIndex("b"), type=WriteItemType.BYTE_IO)
    assert len(split_items([byte_item] * 3, 2)) == 2
