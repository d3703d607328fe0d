from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loomfs.client.layout import chain_of, chunk_count, chunk_range, split_range
from loomfs.wire.types import Layout


@given(
    chunk_size=st.integers(1, 5000),
    nchains=st.integers(1, 7),
    offset=st.integers(0, 100_000),
    length=st.integers(0, 50_000),
)
def test_split_covers_the_range_exactly(chunk_size: int, nchains: int, offset: int, length: int) -> None:
    layout = Layout(chunk_size=chunk_size, chains=[100 + i for i in range(nchains)])
    pieces = list(split_range(layout, offset, length))
    assert sum(p.length for p in pieces) == length
    pos = offset
    for p in pieces:
        assert p.length > 0
        assert 0 <= p.offset and p.offset + p.length <= chunk_size
        assert p.index * chunk_size + p.offset == pos  # contiguous, in order
        assert p.buffer_offset == pos - offset
        assert p.chain_id == layout.chains[p.index % nchains]
        pos += p.length
    assert [p.index for p in pieces] == list(chunk_range(layout, offset, length))
    # only the first and last pieces may be partial chunks
    for p in pieces[1:-1]:
        assert p.offset == 0 and p.length == chunk_size


def test_examples() -> None:
    layout = Layout(chunk_size=10, chains=[1, 2, 3])
    got = [(p.index, p.chain_id, p.offset, p.length, p.buffer_offset) for p in split_range(layout, 5, 30)]
    assert got == [(0, 1, 5, 5, 0), (1, 2, 0, 10, 5), (2, 3, 0, 10, 15), (3, 1, 0, 5, 25)]
    assert chunk_count(layout, 0) == 0 and chunk_count(layout, 10) == 1 and chunk_count(layout, 11) == 2
    assert chain_of(layout, 4) == 2
    with pytest.raises(ValueError):
        list(split_range(layout, -1, 3))
    with pytest.raises(ValueError):
        chain_of(Layout(chunk_size=10, chains=[]), 0)
