"""A test double of the parts of LMCache's storage-backend interface the LoomFS plugin uses,
for machines where ``lmcache`` is not installed (its wheel installs, but its dependencies
pull CUDA packages: cupy-cuda13x, cuda-python, cufile-python).

Taken from LMCache 0.5.6 (``lmcache/v1/storage_backend/abstract_backend.py``,
``lmcache/v1/memory_management.py``, ``lmcache/utils.py``; Apache-2.0): the abstract methods
and the default batched methods of ``StorageBackendInterface`` with their signatures, and
minimal stand-ins for ``CacheEngineKey`` (``to_string``), ``MemoryFormat``, a tensor-backed
``MemoryObj`` (``tensor``, ``byte_array``, shape/dtype/format getters, reference counts) and
the ``LocalCPUBackend.allocate`` the plugin allocates its results from. Plugins are built as
``backend_class(config=, dst_device=, metadata=, local_cpu_backend=, loop=)`` with their
settings in ``config.extra_config`` (``storage_plugin_launcher``).
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch


class MemoryFormat(enum.Enum):
    UNDEFINED = 0
    KV_2LTD = 1  # [2, num_layers, num_tokens, hidden_dim]
    KV_T2D = 2
    BINARY = 3
    KV_MLA_FMT = 5


@dataclass(frozen=True)
class CacheEngineKey:
    model_name: str
    world_size: int
    worker_id: int
    chunk_hash: int
    dtype: torch.dtype = torch.float16

    def to_string(self) -> str:
        return f"{self.model_name}@{self.world_size}@{self.worker_id}@{self.chunk_hash:x}@{self.dtype}"


@dataclass
class MemoryObjMetadata:
    shape: torch.Size
    dtype: torch.dtype
    fmt: MemoryFormat = MemoryFormat.KV_2LTD
    ref_count: int = 1
    cached_positions: Any = None


class TensorMemoryObj:
    """A MemoryObj over one CPU tensor."""

    def __init__(self, tensor: torch.Tensor, fmt: MemoryFormat = MemoryFormat.KV_2LTD,
                 on_free: Callable[[TensorMemoryObj], None] | None = None):
        self._tensor = tensor
        self._meta = MemoryObjMetadata(tensor.shape, tensor.dtype, fmt)
        self._on_free = on_free

    @property
    def tensor(self) -> torch.Tensor:
        return self._tensor

    @property
    def byte_array(self) -> memoryview:
        return self._tensor.reshape(-1).view(torch.uint8).numpy().data.cast("B")

    @property
    def metadata(self) -> MemoryObjMetadata:
        return self._meta

    def get_shape(self) -> torch.Size:
        return self._meta.shape

    def get_dtype(self) -> torch.dtype:
        return self._meta.dtype

    def get_memory_format(self) -> MemoryFormat:
        return self._meta.fmt

    def get_size(self) -> int:
        return self._tensor.numel() * self._tensor.element_size()

    def ref_count_up(self) -> None:
        self._meta.ref_count += 1

    def ref_count_down(self) -> None:
        self._meta.ref_count -= 1
        if self._meta.ref_count == 0 and self._on_free is not None:
            self._on_free(self)

    def get_ref_count(self) -> int:
        return self._meta.ref_count


@dataclass
class CPUAllocator:
    """``LocalCPUBackend.allocate``: a MemoryObj of that shape and dtype (counts live ones)."""

    live: set[int] = field(default_factory=set)

    def allocate(self, shapes: torch.Size | list[torch.Size], dtypes: torch.dtype | list[torch.dtype],
                 fmt: MemoryFormat = MemoryFormat.KV_2LTD, eviction: bool = True,
                 busy_loop: bool = True) -> TensorMemoryObj | None:
        shape = shapes[0] if isinstance(shapes, list) else shapes
        dtype = dtypes[0] if isinstance(dtypes, list) else dtypes
        obj = TensorMemoryObj(torch.empty(shape, dtype=dtype), fmt, on_free=lambda o: self.live.discard(id(o)))
        self.live.add(id(obj))
        return obj


@dataclass
class EngineConfig:
    """``LMCacheEngineConfig``'s field a plugin reads: ``extra_config``."""

    extra_config: dict[str, Any] = field(default_factory=dict)


class StorageBackendInterface(metaclass=abc.ABCMeta):
    def __init__(self, dst_device: str = "cpu"):
        torch.device(dst_device)
        self.dst_device = dst_device

    @abc.abstractmethod
    def contains(self, key: Any, pin: bool = False) -> bool: ...

    @abc.abstractmethod
    def exists_in_put_tasks(self, key: Any) -> bool: ...

    @abc.abstractmethod
    def batched_submit_put_task(self, keys: Sequence[Any], objs: list[Any], transfer_spec: Any = None,
                                on_complete_callback: Callable[[Any], None] | None = None) -> list[Future[Any]] | None: ...

    async def async_batched_submit_put_task(self, keys: Sequence[Any], objs: list[Any], transfer_spec: Any = None,
                                            on_complete_callback: Callable[[Any], None] | None = None) -> None:
        raise NotImplementedError

    @abc.abstractmethod
    def get_blocking(self, key: Any) -> Any: ...

    def get_non_blocking(self, key: Any, location: str | None = None) -> Future[Any] | None:
        raise NotImplementedError

    async def batched_async_contains(self, lookup_id: str, keys: list[Any], pin: bool = False) -> int:
        raise NotImplementedError

    async def batched_get_non_blocking(self, lookup_id: str, keys: list[Any], transfer_spec: Any = None) -> list[Any]:
        raise NotImplementedError

    def batched_get_blocking(self, keys: list[Any]) -> list[Any]:
        return [self.get_blocking(k) for k in keys]

    @abc.abstractmethod
    def pin(self, key: Any) -> bool: ...

    @abc.abstractmethod
    def unpin(self, key: Any) -> bool: ...

    @abc.abstractmethod
    def remove(self, key: Any, force: bool = True) -> bool: ...

    def batched_remove(self, keys: list[Any], force: bool = True) -> int:
        return sum(self.remove(k, force=force) for k in keys)

    @abc.abstractmethod
    def get_allocator_backend(self) -> Any: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    def batched_contains(self, keys: list[Any], pin: bool = False) -> int:
        hits = 0
        for k in keys:
            if not self.contains(k, pin):
                break
            hits += 1
        return hits

    def touch_cache(self) -> None:
        raise NotImplementedError

    def cancel_request(self, req_id: str) -> None:
        return
