"""GF(2^8) arithmetic and the Reed-Solomon matrices (pure numpy; the test oracle).

The field is GF(2)[x]/(x^8+x^4+x^3+x^2+1) (0x11d), the one ISA-L uses, and the generator is
ISA-L's ``gf_gen_cauchy1_matrix``: k identity rows, then ``a[i][j] = 1 / (i ^ j)`` for parity
row i (k <= i < k+m) and data column j. Any k rows of it are invertible, so any k fragments
rebuild the stripe. ``ReferenceCodec`` encodes with lookup tables, slowly and obviously.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from loomfs.ec.codec import Buffer, Codec, check_decode, check_encode

POLY = 0x11D


def _tables() -> tuple[np.ndarray, np.ndarray]:
    exp = np.zeros(512, dtype=np.uint8)
    log = np.zeros(256, dtype=np.int32)
    x = 1
    for i in range(255):
        exp[i] = x
        log[x] = i
        x <<= 1
        if x & 0x100:
            x ^= POLY
    exp[255:510] = exp[0:255]
    return exp, log


EXP, LOG = _tables()


def gf_mul(a: int, b: int) -> int:
    if a == 0 or b == 0:
        return 0
    return int(EXP[LOG[a] + LOG[b]])


def gf_inv(a: int) -> int:
    if a == 0:
        raise ZeroDivisionError("0 has no inverse in GF(256)")
    return int(EXP[255 - LOG[a]])


def _mul_table() -> np.ndarray:
    t = np.zeros((256, 256), dtype=np.uint8)
    for c in range(1, 256):
        t[c, 1:] = EXP[LOG[c] + LOG[np.arange(1, 256)]]
    return t


MUL = _mul_table()  # MUL[c][x] = c * x


def cauchy_matrix(k: int, m: int) -> np.ndarray:
    """(k+m) x k generator: identity on top, Cauchy rows below (ISA-L's cauchy1)."""
    if k < 1 or m < 0 or k + m > 256:
        raise ValueError(f"bad code {k}+{m}")
    a = np.zeros((k + m, k), dtype=np.uint8)
    for i in range(k):
        a[i, i] = 1
    for i in range(k, k + m):
        for j in range(k):
            a[i, j] = gf_inv(i ^ j)
    return a


def invert(matrix: np.ndarray) -> np.ndarray:
    """Inverse of a square GF(256) matrix (Gauss-Jordan); ValueError if singular."""
    n = matrix.shape[0]
    a = matrix.astype(np.uint8).copy()
    inv = np.eye(n, dtype=np.uint8)
    for col in range(n):
        pivot = next((r for r in range(col, n) if a[r, col]), None)
        if pivot is None:
            raise ValueError("singular matrix")
        if pivot != col:
            a[[col, pivot]] = a[[pivot, col]]
            inv[[col, pivot]] = inv[[pivot, col]]
        s = gf_inv(int(a[col, col]))
        a[col] = MUL[s][a[col]]
        inv[col] = MUL[s][inv[col]]
        for r in range(n):
            f = int(a[r, col])
            if r != col and f:
                a[r] ^= MUL[f][a[col]]
                inv[r] ^= MUL[f][inv[col]]
    return inv


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """GF(256) product of two small matrices."""
    out = np.zeros((a.shape[0], b.shape[1]), dtype=np.uint8)
    for i in range(a.shape[0]):
        for j in range(a.shape[1]):
            c = int(a[i, j])
            if c:
                out[i] ^= MUL[c][b[j]]
    return out


def decode_matrix(k: int, m: int, present: Sequence[int], want: Sequence[int]) -> np.ndarray:
    """Rows that turn fragments ``present[:k]`` (in that order) into fragments ``want``."""
    gen = cauchy_matrix(k, m)
    use = list(present[:k])
    inv = invert(gen[use])  # data = inv x present
    return matmul(gen[list(want)], inv)


def _u8(buf: Buffer) -> np.ndarray:
    return np.frombuffer(buf, dtype=np.uint8)


class ReferenceCodec(Codec):
    """Table-lookup RS over numpy: the oracle the fast codec is tested against."""

    name = "reference"

    def __init__(self, k: int, m: int):
        self.k, self.m = k, m
        self._gen = cauchy_matrix(k, m)

    def _apply(self, rows: np.ndarray, inputs: Sequence[Buffer], outputs: Sequence[Buffer]) -> None:
        ins = [_u8(b) for b in inputs]
        for r, out in zip(rows, outputs, strict=True):
            acc = np.zeros(len(ins[0]), dtype=np.uint8)
            for c, x in zip(r, ins, strict=True):
                if c:
                    acc ^= MUL[int(c)][x]
            np.frombuffer(out, dtype=np.uint8)[:] = acc

    def encode(self, data: Sequence[Buffer], parity: Sequence[Buffer]) -> None:
        check_encode(self, data, parity)
        self._apply(self._gen[self.k :], data, parity)

    def decode(self, present: Mapping[int, Buffer], want: Mapping[int, Buffer]) -> None:
        use = check_decode(self, present, want)
        rows = decode_matrix(self.k, self.m, use, list(want))
        self._apply(rows, [present[i] for i in use], list(want.values()))
