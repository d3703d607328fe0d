"""Value kinds (pure): bytes-like, numpy arrays and torch tensors as flat byte views and back.

``as_bytes`` gives a zero-copy byte view of a value (a non-contiguous array or a GPU tensor
is copied once to contiguous host memory) with its kind and descriptor ("dtype;shape");
``rebuild`` turns the bytes read back into the same kind, sharing the buffer; ``target_view``
gives the writable byte view of a caller's ``into=`` buffer. numpy and torch are imported
only when a value of theirs is seen.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from typing import Any

from loomfs.errors import InvalidArgument
from loomfs.kvcache._entry import KIND_BYTES, KIND_NUMPY, KIND_TORCH


def _is_torch(value: object) -> bool:
    return "torch" in sys.modules and type(value).__module__.startswith("torch") and hasattr(value, "untyped_storage")


def _is_numpy(value: object) -> bool:
    """An ndarray or a subclass of it (``np.memmap``, ``np.matrix``)."""
    np = sys.modules.get("numpy")
    return np is not None and isinstance(value, np.ndarray)


def _numpy_desc_dtype(dtype: Any) -> str:
    """The dtype part of a descriptor: ``dtype.str``, or for a structured dtype its ``descr``
    (``dtype.str`` of one is ``|V<n>``: the fields would be lost)."""
    if dtype.names is not None:
        return repr(dtype.descr)
    return str(dtype.str)


def _numpy_dtype(text: str) -> Any:
    import numpy as np

    if text.startswith("["):
        try:
            return np.dtype(ast.literal_eval(text))
        except (ValueError, TypeError, SyntaxError) as exc:
            raise InvalidArgument(f"bad numpy dtype {text!r} in a kvcache entry") from exc
    return np.dtype(text)


def _shape_text(shape: tuple[int, ...]) -> str:
    return ",".join(str(d) for d in shape)


def _parse_desc(desc: str) -> tuple[str, tuple[int, ...]]:
    dtype, _, shape = desc.rpartition(";")  # the shape holds no ";" (a structured dtype's names may)
    try:
        dims = tuple(int(d) for d in shape.split(",") if d != "")
    except ValueError as exc:
        raise InvalidArgument(f"bad kvcache value descriptor {desc!r}") from exc
    return dtype, dims


@dataclass(frozen=True, slots=True)
class ValueInfo:
    """What ``get(key, into=alloc)`` tells ``alloc`` before reading: it returns the buffer to
    read into (an LMCache backend allocates its MemoryObj from this)."""

    nbytes: int
    kind: str  # "bytes" | "numpy" | "torch"
    dtype: str  # numpy dtype string or torch dtype name ("" for bytes)
    shape: tuple[int, ...]


def value_info(nbytes: int, kind: int, desc: str) -> ValueInfo:
    dtype, shape = _parse_desc(desc) if kind != KIND_BYTES else ("", (nbytes,))
    return ValueInfo(nbytes, {KIND_BYTES: "bytes", KIND_NUMPY: "numpy", KIND_TORCH: "torch"}.get(kind, "?"), dtype, shape)


def as_bytes(value: Any) -> tuple[memoryview, int, str]:
    """(flat byte view, kind, descriptor) of a value to store."""
    if _is_torch(value):
        import torch

        t = value.detach()
        if t.layout != torch.strided:
            raise InvalidArgument(f"kvcache cannot store a {t.layout} tensor (dense tensors only)")
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.resolve_conj().resolve_neg().contiguous()  # conj / neg views: their values, materialised
        flat = t.reshape(-1).view(__import__("torch").uint8) if t.numel() else t.new_empty(0, dtype=__import__("torch").uint8)
        desc = f"{str(t.dtype).removeprefix('torch.')};{_shape_text(tuple(t.shape))}"
        return memoryview(flat.numpy()).cast("B"), KIND_TORCH, desc
    if _is_numpy(value):
        import numpy as np

        a = np.ascontiguousarray(np.asarray(value))  # a plain ndarray (np.matrix keeps its 2 dims)
        if a.dtype.hasobject:
            raise InvalidArgument("numpy arrays of Python objects cannot be cached")
        desc = f"{_numpy_desc_dtype(a.dtype)};{_shape_text(a.shape)}"
        return a.reshape(-1).view(np.uint8).data, KIND_NUMPY, desc
    if isinstance(value, bytes | bytearray | memoryview):
        view = memoryview(value)
        if not view.c_contiguous:  # strided or Fortran order: cast() takes C-contiguous views only
            view = memoryview(view.tobytes())
        try:
            return view.cast("B") if view.format != "B" or view.ndim != 1 else view, KIND_BYTES, ""
        except TypeError as exc:
            raise InvalidArgument(f"kvcache cannot take this buffer as bytes: {exc}") from exc
    raise InvalidArgument(f"kvcache values are bytes-like, numpy arrays or torch tensors, not {type(value).__name__}")


def rebuild(kind: int, desc: str, buf: bytearray | memoryview) -> Any:
    """The stored kind over ``buf`` (no copy): bytearray/memoryview, ndarray or tensor."""
    if kind == KIND_BYTES:
        return buf
    dtype_name, shape = _parse_desc(desc)
    if kind == KIND_NUMPY:
        import numpy as np

        return np.frombuffer(buf, dtype=_numpy_dtype(dtype_name)).reshape(shape)
    if kind == KIND_TORCH:
        import torch

        dtype = getattr(torch, dtype_name, None)
        if not isinstance(dtype, torch.dtype):
            raise InvalidArgument(f"unknown torch dtype {dtype_name!r} in a kvcache entry")
        if len(buf) == 0:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(buf, dtype=torch.uint8).view(dtype).reshape(shape)
    raise InvalidArgument(f"unknown kvcache value kind {kind}")


class Target:
    """A caller's ``into=`` buffer: its writable host bytes, and the object handed back."""

    def __init__(self, into: Any):
        self.into = into
        self.device_tensor: Any = None  # a GPU tensor: read into host memory, then copied
        if type(into) is bytearray:  # the common plain buffer: no probing (a get_many per batch)
            self.view = memoryview(into)
            return
        if _is_torch(into):
            if into.device.type != "cpu":
                self.device_tensor = into
                self.view = memoryview(bytearray(into.numel() * into.element_size()))
                return
            if not into.is_contiguous():
                raise InvalidArgument("into= tensor must be contiguous")
            flat = into.reshape(-1).view(__import__("torch").uint8)
            self.view = memoryview(flat.numpy()).cast("B")
        elif _is_numpy(into):
            if not into.flags.c_contiguous or not into.flags.writeable:
                raise InvalidArgument("into= array must be C-contiguous and writable")
            import numpy as np

            plain: Any = np.asarray(into)  # np.matrix: a plain array (reshape keeps a matrix 2-d)
            self.view = memoryview(plain.reshape(-1).view("uint8"))
        else:
            try:
                view = memoryview(into)
            except TypeError as exc:
                raise InvalidArgument(f"into= must be a writable buffer, not {type(into).__name__}") from exc
            if view.readonly or not view.contiguous:
                raise InvalidArgument("into= must be a writable contiguous buffer")
            self.view = view.cast("B") if view.format != "B" or view.ndim != 1 else view

    def fit(self, nbytes: int) -> memoryview:
        """The first ``nbytes`` of the buffer (EINVAL when it is smaller)."""
        if len(self.view) < nbytes:
            raise InvalidArgument(f"into= buffer of {len(self.view)} bytes; the value has {nbytes}")
        return self.view[:nbytes]

    def result(self, nbytes: int) -> Any:
        """What ``get`` returns after ``nbytes`` were read: the caller's object when it was
        exactly that size, else a memoryview of the bytes filled."""
        if self.device_tensor is not None:
            import torch

            host = torch.frombuffer(self.view, dtype=torch.uint8)[:nbytes]
            dev = self.device_tensor.reshape(-1).view(torch.uint8)
            dev[:nbytes].copy_(host)
            return self.device_tensor if nbytes == len(self.view) else dev[:nbytes]
        if nbytes == len(self.view):
            return self.into
        return self.view[:nbytes]
