"""The lock rules of ``loomfs.meta.locks`` without a store: conflicts, POSIX range splits and
merges as Linux does them, owners as signed 64-bit; and the mount's glue that needs no
mount (``loomfs.mount.lowlevel``: pyfuse3's symbols; ``loomfs.mount.locks``: byte ranges)."""

from __future__ import annotations

import errno
import math

import pyfuse3
import pytest

from loomfs.meta.locks import (
    OFFSET_MAX,
    READ,
    UNLOCK,
    WRITE,
    check_range,
    conflict,
    posix_apply,
    to_signed,
    to_unsigned,
)
from loomfs.meta.store.base import LockRow
from loomfs.mount.locks import byte_range
from loomfs.mount.lowlevel import SYM_INIT, SYM_OPS, SYM_SESSION, FileInfo, Flock, elf_symbols

C, OWN = 1, 2


def ranges(rows: list[LockRow]) -> list[tuple[int, int, int]]:
    return [(r.type, r.first, r.last) for r in rows]


def apply(rows: list[LockRow], type_: int, first: int, last: int) -> list[LockRow]:
    return posix_apply(rows, type_, first, last, 0, C, OWN)


def test_split_merge_and_replace_like_linux() -> None:
    rows = apply([], WRITE, 10, 19)
    rows = apply(rows, WRITE, 20, 29)  # touching, same type: joined
    assert ranges(rows) == [(WRITE, 10, 29)]
    rows = apply(rows, READ, 15, 24)  # a different type in the middle: three pieces
    assert ranges(rows) == [(WRITE, 10, 14), (READ, 15, 24), (WRITE, 25, 29)]
    rows = apply(rows, UNLOCK, 12, 26)
    assert ranges(rows) == [(WRITE, 10, 11), (WRITE, 27, 29)]
    rows = apply(rows, WRITE, 0, OFFSET_MAX)  # covers everything
    assert ranges(rows) == [(WRITE, 0, OFFSET_MAX)]
    rows = apply(rows, UNLOCK, 100, OFFSET_MAX)
    assert ranges(rows) == [(WRITE, 0, 99)]
    rows = apply(rows, UNLOCK, 0, 99)
    assert rows == []
    rows = apply(apply([], READ, 0, 0), READ, 2, 2)  # a gap: not joined
    assert ranges(rows) == [(READ, 0, 0), (READ, 2, 2)]
    assert ranges(apply(rows, READ, 1, 1)) == [(READ, 0, 2)]


def test_conflicts_need_overlap_another_owner_and_a_writer() -> None:
    rows = [LockRow(C, OWN, READ, 0, 9), LockRow(C + 1, OWN, WRITE, 20, 29)]
    assert conflict(rows, C, OWN, WRITE, 0, 100) == rows[1]  # its own read lock is no conflict
    assert conflict(rows, C, OWN + 1, WRITE, 5, 5) == rows[0]  # another owner of the same client
    assert conflict(rows, C, OWN + 1, READ, 0, 19) is None  # reads share
    assert conflict(rows, C + 1, OWN, WRITE, 10, 19) is None  # no overlap
    assert conflict(rows, C + 2, 9, READ, 29, 29) == rows[1]


def test_owners_and_ranges_checked() -> None:
    for owner in (0, 1, (1 << 63) - 1, 1 << 63, (1 << 64) - 1):
        assert to_unsigned(to_signed(owner)) == owner
        assert -(1 << 63) <= to_signed(owner) < 1 << 63
    for bad in ((1, 5, 4), (1, -1, 4), (3, 0, 1)):
        with pytest.raises(OSError) as info:
            check_range(2, *bad)
        assert info.value.errno == errno.EINVAL


def test_byte_ranges_from_libfuse() -> None:
    assert byte_range(0, 0) == (0, OFFSET_MAX)
    assert byte_range(100, 10) == (100, 109)
    assert byte_range(OFFSET_MAX - 1, 5) == (OFFSET_MAX - 1, OFFSET_MAX)
    with pytest.raises(OSError):
        byte_range(-1, 5)


def test_the_glue_finds_pyfuse3s_symbols_and_knows_the_structs() -> None:
    """What ``Libfuse.install`` relies on, checked without mounting: the symbols are in the
    installed pyfuse3's .symtab, and libfuse's structs have the sizes the kernel ABI gives."""
    syms = elf_symbols(pyfuse3.__file__, {SYM_SESSION, SYM_OPS, SYM_INIT})
    assert set(syms) == {SYM_SESSION, SYM_OPS, SYM_INIT} and all(syms.values())
    assert FileInfo.lock_owner.offset == 24 and FileInfo.fh.offset == 16
    assert Flock.l_start.offset == 8 and Flock.l_pid.offset == 24


def test_a_lease_that_is_not_a_number_gets_the_default() -> None:
    """A hostile LOCK_SET/LOCK_RENEW with lease_s NaN made ``int`` raise (INTERNAL; the
    hostile-peer fuzzer in session 13's CI); bounds hold for the infinities."""
    from loomfs.meta.locks import DEFAULT_LEASE_S, LEASE_MAX_S, LEASE_MIN_S, bounded_lease_ns

    assert bounded_lease_ns(math.nan) == bounded_lease_ns(0.0) == int(DEFAULT_LEASE_S * 1e9)
    assert bounded_lease_ns(math.inf) == int(LEASE_MAX_S * 1e9)
    assert bounded_lease_ns(-math.inf) == bounded_lease_ns(-1.0) == int(LEASE_MIN_S * 1e9)
