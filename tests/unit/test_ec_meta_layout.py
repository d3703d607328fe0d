"""Meta's EC layouts (no I/O): directory validation and EC group placement."""

from __future__ import annotations

import random

import pytest

from loomfs.common.routing import Routing
from loomfs.errors import StatusError
from loomfs.meta.layout import ChainAllocator, pick_ec_chains, validate_dir_layout
from loomfs.wire.status import Status
from loomfs.wire.types import ChainInfo, ChainTable, Layout, RoutingInfo, TargetInfo, TargetState


def _routing(nodes: list[int], dead: frozenset[int] = frozenset()) -> tuple[Routing, ChainTable]:
    targets = [TargetInfo(target_id=100 + i, node_id=n, chain_id=10 + i,
                          state=TargetState.LASTSRV if n in dead else TargetState.SERVING)
               for i, n in enumerate(nodes)]
    chains = [ChainInfo(chain_id=10 + i, targets=[100 + i], table_id=2) for i in range(len(nodes))]
    table = ChainTable(table_id=2, replicas=1, chain_ids=[c.chain_id for c in chains], ec=True)
    return Routing(RoutingInfo(version=1, targets=targets, chains=chains, tables=[table])), table


def test_validate_ec_dir_layout() -> None:
    lay = validate_dir_layout(Layout(chunk_size=1 << 20, ec_k=4, ec_m=2, table_id=0))
    assert (lay.ec_k, lay.ec_m, lay.replicas, lay.stripe, lay.inline_max_bytes) == (4, 2, 1, 6, 0)
    for bad in (Layout(ec_k=4, ec_m=0), Layout(ec_k=0, ec_m=2), Layout(ec_k=30, ec_m=4),
                Layout(ec_k=4, ec_m=2, replicas=3)):
        with pytest.raises(StatusError) as e:
            validate_dir_layout(bad)
        assert e.value.status is Status.EINVAL


def test_ec_group_on_distinct_nodes() -> None:
    r, table = _routing([1, 1, 2, 3, 4, 5, 6, 2])
    for pos in range(8):
        picked = pick_ec_chains(r, list(table.chain_ids), 6, pos)
        assert len(picked) == 6
        assert len({r.targets[r.chains[c].targets[0]].node_id for c in picked}) == 6


def test_ec_group_prefers_serving_chains_and_refuses_too_few_nodes() -> None:
    r, table = _routing([1, 2, 3, 4, 5, 6, 7], dead=frozenset({3}))
    picked = pick_ec_chains(r, list(table.chain_ids), 6, 0)
    assert 12 not in picked  # chain 12 is on the dead node 3
    r, table = _routing([1, 2, 3, 4, 5, 6], dead=frozenset({3}))
    assert len(pick_ec_chains(r, list(table.chain_ids), 6, 0)) == 6  # all needed: the dead one too
    with pytest.raises(StatusError) as e:
        pick_ec_chains(r, list(table.chain_ids), 7, 0)
    assert e.value.status is Status.EINVAL and "7 storage nodes" in str(e.value)


def test_allocator_places_ec_files() -> None:
    r, table = _routing([1, 2, 3, 4, 5, 6])
    alloc = ChainAllocator(random.Random(1))
    parent = validate_dir_layout(Layout(chunk_size=1 << 20, ec_k=4, ec_m=2, table_id=0))
    lay = alloc.file_layout(table, parent, r)
    assert (lay.ec_k, lay.ec_m, lay.table_id, lay.replicas) == (4, 2, 2, 1) and len(set(lay.chains)) == 6
