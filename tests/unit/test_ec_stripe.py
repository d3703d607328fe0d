"""Stripe math and fragment headers."""

from __future__ import annotations

from loomfs.ec.stripe import HEADER_BYTES, FragmentHeader, Geometry, split_range


def test_header_round_trip_and_garbage() -> None:
    h = FragmentHeader(k=4, m=2, fragment=5, stripe=9, version=(1 << 63) + 3, stripe_len=12345,
                       payload_len=4096, crc=0xFFFFFFFF)
    raw = h.pack()
    assert len(raw) == HEADER_BYTES
    assert FragmentHeader.unpack(raw) == h
    assert FragmentHeader.unpack(raw[:10]) is None
    assert FragmentHeader.unpack(bytes(64)) is None


def test_split_range_covers_data_fragments() -> None:
    g = Geometry(k=4, m=2, chunk_size=100)
    pieces = list(split_range(g, 350, 200))
    assert [(p.stripe, p.fragment, p.offset, p.length, p.buffer_offset) for p in pieces] == [
        (0, 3, 50, 50, 0), (1, 0, 0, 100, 50), (1, 1, 0, 50, 150)]
    assert sum(p.length for p in split_range(g, 0, 1234)) == 1234
    assert g.chunk_index(1, 3) == 6 + (3 + 1) % 6
    assert g.chunk_index(1, 3, shadow=True) > g.chunk_index(10**6, 0)


def test_partial_stripe_lengths() -> None:
    g = Geometry(k=4, m=2, chunk_size=100)
    assert [g.payload_len(250, j) for j in range(6)] == [100, 100, 50, 0, 100, 100]
    assert [g.payload_len(30, j) for j in range(6)] == [30, 0, 0, 0, 30, 30]
    assert g.stripes(0) == 0 and g.stripes(400) == 1 and g.stripes(401) == 2
    assert g.stripe_len(1, 401) == 1 and g.stripe_len(2, 401) == 0


def test_fragments_rotate_over_the_chains() -> None:
    for k, m in ((4, 2), (10, 4), (3, 2)):
        g = Geometry(k=k, m=m, chunk_size=1 << 20)
        w = k + m
        for s in (0, 1, 77):
            live = [g.chunk_index(s, j) for j in range(w)]
            shadow = [g.chunk_index(s, j, shadow=True) for j in range(w)]
            assert sorted(live) == list(g.stripe_chunks(s)) == list(range(s * w, (s + 1) * w))
            assert sorted(shadow) == list(g.stripe_chunks(s, shadow=True))
            for j in range(w):
                assert live[j] % w == shadow[j] % w == g.chain_slot(s, j) == (j + s) % w
        # over k+m stripes every chain holds every fragment role once
        assert {g.chain_slot(s, 0) for s in range(w)} == set(range(w))
