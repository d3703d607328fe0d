"""How one item lies in a data file: raw tensor bytes (no pickling), or a BytesIO's bytes."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from loomfs.checkpoint._format_light import crc

KIND_TENSOR = "tensor"
KIND_BYTES = "bytes"


@dataclasses.dataclass(frozen=True, slots=True)
class ItemLoc:
    """``Metadata.storage_data`` values: where an item's bytes are and how to rebuild it."""

    file: str
    offset: int
    length: int
    crc32c: int
    kind: str = KIND_TENSOR
    dtype: str = ""
    shape: tuple[int, ...] = ()

    def __repr__(self) -> str:
        return f"ItemLoc({self.file}@{self.offset}+{self.length})"


@dataclasses.dataclass(frozen=True, slots=True)
class PlanInfo:
    """What the coordinator tells every rank in ``SavePlan.storage_data``."""

    rank: int
    world_size: int
    staging: str  # the staging directory on LoomFS
    final: str  # the checkpoint directory it is renamed to


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_of(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, without a copy (writable when ``t`` is)."""
    if not t.is_contiguous() or t.device.type != "cpu":
        raise ValueError("tensor_bytes needs a contiguous CPU tensor")
    if t.numel() == 0:
        return memoryview(bytearray())
    arr: Any = t.reshape(-1).view(torch.uint8).numpy()
    return memoryview(arr)

__all__ = ["ItemLoc", "PlanInfo", "crc", "dtype_name", "dtype_of", "tensor_bytes"]
