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
