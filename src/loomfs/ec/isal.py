"""RS(k, m) through ISA-L's ``ec_encode_data`` called directly with ctypes (Debian libisal2).

Same generator as the reference (``gf_gen_cauchy1_matrix``); decode matrices come from
``loomfs.ec.gf256`` and their expanded tables are cached per erasure pattern. Pointer arrays
are rebuilt per call from the caller's buffers (a few microseconds); the data is not copied.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from collections.abc import Mapping, Sequence
from functools import lru_cache

import numpy as np

from loomfs.ec.codec import Buffer, Codec, check_decode, check_encode
from loomfs.ec.gf256 import cauchy_matrix, decode_matrix

_LIB: ctypes.CDLL | None = None
_LOADED = False
_LOCK = threading.Lock()


def _load() -> ctypes.CDLL | None:
    global _LIB, _LOADED
    with _LOCK:
        if not _LOADED:
            _LOADED = True
            for name in ("libisal.so.2", ctypes.util.find_library("isal")):
                if not name:
                    continue
                try:
                    lib = ctypes.CDLL(name)
                except OSError:
                    continue
                lib.ec_init_tables.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
                lib.ec_init_tables.restype = None
                lib.ec_encode_data.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                               ctypes.c_void_p, ctypes.c_void_p]
                lib.ec_encode_data.restype = None
                _LIB = lib
                break
    return _LIB


def isal_available() -> bool:
    return _load() is not None


def _tables(k: int, rows: np.ndarray) -> np.ndarray:
    lib = _load()
    assert lib is not None
    rows = np.ascontiguousarray(rows, dtype=np.uint8)
    g = np.zeros(k * rows.shape[0] * 32, dtype=np.uint8)
    lib.ec_init_tables(k, rows.shape[0], rows.ctypes.data, g.ctypes.data)
    return g


def _addr(b: Buffer) -> int:
    a = np.frombuffer(b, dtype=np.uint8)
    return int(a.ctypes.data)


class IsalCodec(Codec):
    name = "isal"

    def __init__(self, k: int, m: int):
        self._lib = _load()
        if self._lib is None:
            raise OSError("libisal.so.2 not found (apt-get install libisal2)")
        self.k, self.m = k, m
        self._enc = _tables(k, cauchy_matrix(k, m)[k:])

    @lru_cache(maxsize=256)  # noqa: B019 - one codec per (k, m), cached for the process
    def _dec(self, use: tuple[int, ...], want: tuple[int, ...]) -> np.ndarray:
        return _tables(self.k, decode_matrix(self.k, self.m, use, want))

    def _run(self, n: int, tables: np.ndarray, rows: int, ins: Sequence[Buffer], outs: Sequence[Buffer]) -> None:
        src = (ctypes.c_void_p * len(ins))(*[_addr(b) for b in ins])
        dst = (ctypes.c_void_p * len(outs))(*[_addr(b) for b in outs])
        assert self._lib is not None
        self._lib.ec_encode_data(n, self.k, rows, tables.ctypes.data, src, dst)

    def encode(self, data: Sequence[Buffer], parity: Sequence[Buffer]) -> None:
        n = check_encode(self, data, parity)
        if n and self.m:
            self._run(n, self._enc, self.m, data, parity)

    def decode(self, present: Mapping[int, Buffer], want: Mapping[int, Buffer]) -> None:
        use = check_decode(self, present, want)
        if not want:
            return
        n = memoryview(present[use[0]]).nbytes
        if n:
            self._run(n, self._dec(tuple(use), tuple(want)), len(want), [present[i] for i in use], list(want.values()))
