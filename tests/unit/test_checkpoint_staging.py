"""The async-save stager: staged copies are independent of the live state, reused once the
save that read them has written them, never while busy."""

from __future__ import annotations

import torch

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
