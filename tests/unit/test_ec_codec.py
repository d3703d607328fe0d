"""RS codecs: ISA-L against the numpy reference, every erasure pattern of the codes we use."""

from __future__ import annotations

import itertools
import random

import pytest

from loomfs.ec.codec import make_codec
from loomfs.ec.gf256 import cauchy_matrix, gf_inv, gf_mul, invert, matmul
from loomfs.ec.isal import isal_available

CODES = [(4, 2), (10, 4), (2, 1)]
KINDS = ["reference"] + (["isal"] if isal_available() else [])


def _stripe(rng: random.Random, k: int, n: int) -> list[bytes]:
    return [rng.randbytes(n) for _ in range(k)]


def test_field_basics() -> None:
    for a in range(1, 256):
        assert gf_mul(a, gf_inv(a)) == 1
    assert gf_mul(0x80, 2) == 0x1D  # x^8 reduces by 0x11d
    g = cauchy_matrix(4, 2)
    for rows in itertools.combinations(range(6), 4):
        sub = g[list(rows)]
        assert (matmul(sub, invert(sub)) == matmul(invert(sub), sub)).all()


@pytest.mark.parametrize("k,m", CODES)
def test_isal_matches_reference_encode(k: int, m: int) -> None:
    if not isal_available():
        pytest.skip("libisal.so.2 not installed")
    rng = random.Random(k * 100 + m)
    for n in (1, 63, 64, 4097, 65536):
        data = _stripe(rng, k, n)
        want = [bytearray(n) for _ in range(m)]
        got = [bytearray(n) for _ in range(m)]
        make_codec(k, m, "reference").encode(data, want)
        make_codec(k, m, "isal").encode(data, got)
        assert got == want, f"n={n}"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("k,m", CODES)
def test_any_k_fragments_rebuild_the_rest(kind: str, k: int, m: int) -> None:
    rng = random.Random(7 + k + m)
    n = 4096 + 17
    data = _stripe(rng, k, n)
    parity = [bytearray(n) for _ in range(m)]
    make_codec(k, m, "reference").encode(data, parity)
    frags = [*data, *map(bytes, parity)]
    codec = make_codec(k, m, kind)
    patterns = list(itertools.combinations(range(k + m), m))
    for lost in rng.sample(patterns, min(len(patterns), 40)):
        present = {i: frags[i] for i in range(k + m) if i not in lost}
        out = {i: bytearray(n) for i in lost}
        codec.decode(present, out)
        for i in lost:
            assert out[i] == frags[i], f"{kind} {k}+{m} lost={lost} fragment {i}"


@pytest.mark.parametrize("kind", KINDS)
def test_bad_calls_are_refused(kind: str) -> None:
    c = make_codec(4, 2, kind)
    with pytest.raises(ValueError):
        c.encode([b"a"] * 3, [bytearray(1)] * 2)
    with pytest.raises(ValueError):
        c.encode([b"a"] * 4, [bytearray(2)] * 2)
    with pytest.raises(ValueError):
        c.decode({0: b"a", 1: b"a", 2: b"a"}, {3: bytearray(1)})
    with pytest.raises(ValueError):
        c.decode({0: b"a", 1: b"a", 2: b"a", 9: b"a"}, {3: bytearray(1)})
