"""Value conversion (pure): odd-but-valid arrays, tensors and buffers round-trip or are refused
with InvalidArgument, never a TypeError/RuntimeError from deep inside numpy or torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from loomfs.errors import InvalidArgument
from loomfs.kvcache._entry import KIND_BYTES, KIND_NUMPY, KIND_TORCH
from loomfs.kvcache._values import Target, as_bytes, rebuild


def _round_trip(value: object) -> object:
    view, kind, desc = as_bytes(value)
    return rebuild(kind, desc, bytearray(view))


def test_fortran_order_memoryview_is_stored_in_c_order() -> None:
    fort = np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    view, kind, _ = as_bytes(memoryview(fort))
    assert kind == KIND_BYTES and bytes(view) == memoryview(fort).tobytes()


def test_torch_conj_and_neg_views_store_their_values() -> None:
    c = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    back = _round_trip(c.conj())
    assert isinstance(back, torch.Tensor) and torch.equal(back, c.conj().resolve_conj())
    n = torch.tensor([1.0, -2.0])._neg_view()
    back = _round_trip(n)
    assert isinstance(back, torch.Tensor) and torch.equal(back, torch.tensor([-1.0, 2.0]))


def test_sparse_tensor_is_invalid_argument() -> None:
    with pytest.raises(InvalidArgument):
        as_bytes(torch.eye(3).to_sparse())


def test_structured_dtype_round_trips() -> None:
    a = np.array([(1, 2.5), (3, 4.5)], dtype=[("a", "<i4"), ("b;c", "<f4")])
    _, kind, desc = as_bytes(a)
    back = _round_trip(a)
    assert kind == KIND_NUMPY and isinstance(back, np.ndarray)
    assert back.dtype == a.dtype and back.tolist() == a.tolist(), desc


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.matrix
def test_numpy_subclasses_are_arrays(tmp_path: object) -> None:
    mm = np.memmap(f"{tmp_path}/mm.bin", dtype=np.float32, mode="w+", shape=(4,))
    mm[:] = [1, 2, 3, 4]
    _, kind, desc = as_bytes(mm)
    assert kind == KIND_NUMPY and desc == "<f4;4"
    assert np.array_equal(np.asarray(_round_trip(mm)), [1, 2, 3, 4])
    m = np.matrix([[1, 2]], dtype=np.int64)
    _, kind, desc = as_bytes(m)
    assert kind == KIND_NUMPY and desc == "<i8;1,2"
    into = np.memmap(f"{tmp_path}/into.bin", dtype=np.float32, mode="w+", shape=(4,))
    Target(into).fit(16)[:] = np.arange(4, dtype=np.float32).tobytes()
    assert into.tolist() == [0, 1, 2, 3]


def test_plain_values_keep_their_descriptors() -> None:
    assert as_bytes(torch.zeros(2, 3))[1:] == (KIND_TORCH, "float32;2,3")
    assert as_bytes(np.zeros((2, 2), np.float16))[1:] == (KIND_NUMPY, "<f2;2,2")
