"""python -m loomfs.bench.metacost runs (no sockets: frames fed to meta's real RpcServer)."""

from __future__ import annotations

import asyncio

import pytest

from loomfs.bench import metacost


@pytest.mark.parametrize("eager", [True, False])
def test_metacost_measures_every_kind_both_ways(eager: bool) -> None:
    best = asyncio.run(metacost.measure(12, 1, ("stat", "read", "put", "stat_many"), eager=eager))
    assert set(best) == {(k, who) for k in ("stat", "read", "put", "stat_many") for who in ("trusted", "uid0", "uid1000")}
    assert all(us > 0 for us in best.values())
