"""The async-save stager: staged copies are independent of the live state, reused once the
save that read them has written them, never while busy."""

from __future__ import annotations

import os
import select
import signal
from collections.abc import Callable

import pytest
import torch

from loomfs.checkpoint import _staging
from loomfs.checkpoint._staging import Stager, signature


def state(step: int) -> dict[str, object]:
    g = torch.Generator().manual_seed(step)
    return {"model": {"w": torch.rand(64, 8, generator=g), "b": torch.rand(8, generator=g)},
            "optim": {"state": {0: {"step": torch.tensor(float(step))}}, "param_groups": [{"lr": 0.1, "betas": (0.9, 0.99)}]},
            "extra": {"step": step, "name": "run"}}


def ptrs(d: dict[str, object]) -> list[int]:
    m = d["model"]
    assert isinstance(m, dict)
    return [m["w"].data_ptr(), m["b"].data_ptr()]


def test_staged_copy_is_independent_of_the_live_state() -> None:
    st = Stager()
    live = state(1)
    staged, token = st.stage(live)
    assert token is not None
    live["model"]["w"].add_(1.0)  # type: ignore[index]
    assert torch.equal(staged["model"]["w"], state(1)["model"]["w"])  # type: ignore[index]
    assert ptrs(staged) != ptrs(live)


def test_released_copy_is_reused_with_new_values_and_scalars() -> None:
    st = Stager()
    first, token = st.stage(state(1))
    kept = ptrs(first)
    st.release(token)
    second, token2 = st.stage(state(2))
    assert ptrs(second) == kept  # the same memory, copied again
    assert torch.equal(second["model"]["w"], state(2)["model"]["w"])  # type: ignore[index]
    assert second["extra"] == {"step": 2, "name": "run"}
    assert second["optim"]["param_groups"][0]["betas"] == (0.9, 0.99)  # type: ignore[index]
    assert (st.reused_total, st.allocated_total) == (1, 1)
    assert repr(st) == "Stager(sets=1 busy=1 reused=1)"
    st.release(token2)


def test_busy_copy_is_never_overwritten() -> None:
    st = Stager()
    first, _token = st.stage(state(1))  # not released: its save still reads it
    second, _ = st.stage(state(2))
    assert ptrs(first) != ptrs(second)
    assert torch.equal(first["model"]["w"], state(1)["model"]["w"])  # type: ignore[index]
    assert st.reused_total == 0


def test_another_structure_gets_its_own_copy() -> None:
    st = Stager()
    a, ta = st.stage(state(1))
    st.release(ta)
    other = {"model": {"w": torch.zeros(3, 3)}}
    b, tb = st.stage(other)
    st.release(tb)
    assert st.reused_total == 0 and torch.equal(b["model"]["w"], torch.zeros(3, 3))  # type: ignore[index]
    assert signature(other) != signature(state(1))


def test_unknown_objects_fall_back_to_a_deep_copy_every_time() -> None:
    class Obj:
        def __init__(self) -> None:
            self.t = torch.ones(4)

    live = {"o": Obj(), "w": torch.ones(2)}
    assert signature(live) is None
    staged, token = Stager().stage(live)
    assert token is None
    live["w"].add_(1)  # type: ignore[operator]
    assert torch.equal(staged["w"], torch.ones(2))


def test_reused_copy_takes_every_kind_of_tensor_bytewise() -> None:
    """The reuse path memmoves contiguous CPU tensors (over several threads) and copy_s the
    rest; every value lands, views and odd sizes included, and no staged tensor aliases."""
    base = torch.arange(64, dtype=torch.float32).reshape(8, 8)

    def state(k: int) -> dict[str, object]:
        return {"big": [torch.full((1 << 16,), float(k)) for _ in range(5)],
                "odd": torch.arange(7, dtype=torch.int8) + k, "empty": torch.empty(0),
                "scalar": torch.tensor(float(k)), "t": (base + k).t(), "slice": (base + k)[2:5],
                "half": torch.ones(3, dtype=torch.float16) * k, "step": k}

    st = Stager()
    first, tok = st.stage(state(1))
    st.release(tok)
    live = state(2)
    again, tok2 = st.stage(live)
    assert tok2 is tok and st.reused_total == 1
    for a, b in zip(again["big"], live["big"], strict=True):  # type: ignore[arg-type]
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
    for key in ("odd", "empty", "scalar", "t", "slice", "half"):
        assert torch.equal(again[key], live[key]), key  # type: ignore[arg-type]
        assert again[key].dtype == live[key].dtype  # type: ignore[union-attr]
    assert again["step"] == 2
    live["big"][0].fill_(9.0)  # type: ignore[index]
    assert float(again["big"][0][0]) == 2.0  # type: ignore[index]


def restaged(make: Callable[[int], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``make(2)`` staged into the copy that staged ``make(1)`` (the reused path), and the live
    tensor it was staged from."""
    st = Stager()
    _, tok = st.stage({"w": make(1)})
    st.release(tok)
    live = {"w": make(2)}
    again, tok2 = st.stage(live)
    assert tok2 is tok and st.reused_total == 1
    return again["w"], live["w"]


def conj_view(k: int) -> torch.Tensor:
    return (torch.arange(8.0).to(torch.complex64) * (1 + 2j) * k).conj()


def neg_view(k: int) -> torch.Tensor:
    return torch._neg_view(torch.arange(1.0, 9.0) * k)


@pytest.mark.parametrize("make", [conj_view, neg_view])
def test_reused_copy_keeps_lazy_conj_and_neg_bits(make: Callable[[int], torch.Tensor]) -> None:
    """A conj or neg view's memory holds the values before the lazy bit; memmoving it staged
    the unconjugated / unnegated values (review F3)."""
    staged, live = restaged(make)
    assert live.is_conj() or live.is_neg()
    assert torch.equal(staged.resolve_conj().resolve_neg(), live.resolve_conj().resolve_neg())


def test_reused_copy_keeps_the_quantizer() -> None:
    """A quantized tensor is its int representation plus scale and zero point; memmoving the
    ints left the staged copy with the first save's scale (review F3)."""
    staged, live = restaged(lambda k: torch.quantize_per_tensor(
        torch.arange(8.0) * k, scale=0.1 * k, zero_point=k, dtype=torch.qint8))
    assert staged.is_quantized
    assert (staged.q_scale(), staged.q_zero_point()) == (live.q_scale(), live.q_zero_point())
    assert torch.equal(staged.int_repr(), live.int_repr())
    assert torch.equal(staged.dequantize(), live.dequantize())


def test_reused_copy_of_an_efficient_zero_tensor() -> None:
    """A ZeroTensor (forward-AD's zeros) has no memory: data_ptr() is 0 though it reports
    numel * itemsize bytes, so a memmove from it read address 0 (a segfault)."""
    staged, live = restaged(lambda k: torch._efficientzerotensor(4))
    assert live.data_ptr() == 0 and live.nbytes == 16
    assert torch.equal(staged, torch.zeros(4))


def test_only_a_plain_tensor_is_copied_as_bytes() -> None:
    """What the memmove path takes: exactly the tensors whose value is their bytes."""
    x = torch.arange(16.0)
    with torch.inference_mode():
        inference = torch.ones(4)

    class Sub(torch.Tensor):
        pass

    plain = {"plain": x, "offset view": x[3:9], "parameter": torch.nn.Parameter(x).detach(),
             "inference": inference, "bool": x > 3, "bf16": x.to(torch.bfloat16),
             "complex32": x.to(torch.complex32), "float8": x.to(torch.float8_e4m3fn),
             "empty": torch.empty(0)}
    other = {"conj": x.to(torch.complex64).conj(), "neg": torch._neg_view(x),
             "quantized": torch.quantize_per_tensor(x, 0.5, 0, torch.quint8),
             "zero tensor": torch._efficientzerotensor(16), "functional": torch._to_functional_tensor(x),
             "sparse": x.to_sparse(), "mkldnn": x.to_mkldnn(), "meta": torch.empty(16, device="meta"),
             "subclass": x.as_subclass(Sub), "transposed": x.view(4, 4).t(), "expanded": x[:1].expand(16)}
    for name, t in plain.items():
        assert _staging._bytes_only(t), name
    for name, t in other.items():
        assert not _staging._bytes_only(t), name


def test_forked_child_stages_after_the_parent_did(monkeypatch: pytest.MonkeyPatch) -> None:
    """The copy threads' pool does not survive fork: a child that reused its parent's pool
    queued its copy on threads that are not there, and hung (review F4)."""
    monkeypatch.setattr(_staging, "COPY_THREADS", 2)  # the pool, even on a 1-CPU machine
    st = Stager()
    sd = {f"t{i}": torch.full((1024,), float(i)) for i in range(4)}  # several bins: the pool
    for _ in range(2):
        _, tok = st.stage(sd)
        st.release(tok)
    assert st.reused_total == 1
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child stages once more, says whether it matched, and leaves
        code = 1
        try:
            again, _ = st.stage(sd)
            code = 0 if all(torch.equal(again[k], v) for k, v in sd.items()) else 2
        finally:
            os.write(w, bytes([code]))
            os._exit(code)
    os.close(w)
    try:
        ready, _, _ = select.select([r], [], [], 30.0)
        answer = os.read(r, 1) if ready else b""
    finally:
        os.close(r)
        if not ready:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    assert answer == b"\x00", "the child's stage did not finish within 30 s" if not ready else answer
    assert os.waitstatus_to_exitcode(status) == 0


def test_the_reference_keys_do_not_follow_the_importers_defaults() -> None:
    """A default device (``torch.set_default_device``, common in GPU scripts) or inference mode
    set before the import must not change what counts as a plain CPU tensor: with 'meta' as the
    default every CPU tensor missed the memmove path (review2's R5)."""
    from loomfs.checkpoint import _staging

    plain = torch._C._dispatch_keys(torch.ones(4))
    torch.set_default_device("meta")
    try:
        with torch.inference_mode():
            keys = _staging._plain_keys()
    finally:
        torch.set_default_device(None)
    assert keys == plain == _staging._PLAIN_KEYS
    assert _staging._bytes_only(torch.ones(1024))
