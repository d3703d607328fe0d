"""Chain choice (pure) and directory layout validation."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from loomfs.errors import StatusError
from loomfs.meta.layout import ChainAllocator, pick_chains, validate_dir_layout
from loomfs.wire.status import Status
from loomfs.wire.types import ChainTable, Layout


def test_pick_chains_consecutive_and_wrapping() -> None:
    ids = [10, 11, 12, 13, 14]
    assert pick_chains(ids, 3, 0) == [10, 11, 12]
    assert pick_chains(ids, 3, 4) == [14, 10, 11]
    assert pick_chains(ids, 16, 2) == [12, 13, 14, 10, 11]  # width = min(stripe, chains)
    assert pick_chains(ids, 1, 7) == [12]
    with pytest.raises(StatusError) as ei:
        pick_chains([], 4, 0)
    assert ei.value.status is Status.NO_CHAIN_TABLE


def test_allocator_round_robin_spreads_load() -> None:
    table = ChainTable(table_id=3, replicas=2, chain_ids=list(range(1, 9)))
    parent = Layout(chunk_size=1 << 20, stripe=2, table_id=3)
    alloc = ChainAllocator(random.Random(1))
    layouts = [alloc.file_layout(table, parent) for _ in range(80)]
    firsts = Counter(lay.chains[0] for lay in layouts)
    assert set(firsts.values()) == {10}  # every chain heads the same number of files
    assert all(lay.table_id == 3 and lay.replicas == 2 and lay.chunk_size == 1 << 20 for lay in layouts)
    assert all(len(lay.chains) == 2 for lay in layouts)
    # seeded: the same seed gives the same start, different seeds usually differ
    a = ChainAllocator(random.Random(5)).file_layout(table, parent).chains
    b = ChainAllocator(random.Random(5)).file_layout(table, parent).chains
    assert a == b
    starts = {ChainAllocator(random.Random(s)).file_layout(table, parent).chains[0] for s in range(20)}
    assert len(starts) > 3


def test_validate_dir_layout() -> None:
    got = validate_dir_layout(Layout(chunk_size=64 << 10, stripe=1, table_id=2, replicas=3, chains=[1]))
    assert got == Layout(chunk_size=64 << 10, stripe=1, table_id=2, replicas=3, chains=[])
    validate_dir_layout(Layout(chunk_size=64 << 20, stripe=200))
    for bad in (Layout(chunk_size=3 << 20), Layout(chunk_size=1 << 15), Layout(stripe=0),
                Layout(table_id=-1), None):
        with pytest.raises(StatusError) as ei:
            validate_dir_layout(bad)
        assert ei.value.status is Status.EINVAL
