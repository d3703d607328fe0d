"""Per-block CRC32C arithmetic: the CRC of every ``BLOCK_BYTES`` block of a chunk version,
combined, shifted, checked and carried across updates without rereading kept bytes (see
``base``: bit rot is never blessed)."""

from __future__ import annotations

import array
import functools
import struct
from collections.abc import Callable

import crc32c

from loomfs.errors import InvalidArgument, NotFound, StatusError
from loomfs.storage.engine.types import _ZEROS, BLOCK_BYTES, ChunkKey, ChunkState
from loomfs.wire.status import Status


def crc_zeros(count: int, value: int = 0) -> int:
    """CRC32C of ``count`` zero bytes, continuing from ``value``."""
    while count > 0:
        step = min(count, len(_ZEROS))
        value = crc32c.crc32c(memoryview(_ZEROS)[:step], value)
        count -= step
    return value


_ZERO_BLOCK_CRC = crc_zeros(BLOCK_BYTES)


# ---- per-block CRCs: packed as little-endian uint32s, one per BLOCK_BYTES block -------------
def block_count(length: int) -> int:
    return (length + BLOCK_BYTES - 1) // BLOCK_BYTES


def block_crc(blocks: bytes, i: int) -> int:
    """The stored CRC of block ``i``."""
    return int(struct.unpack_from("<I", blocks, 4 * i)[0])


def unpack_blocks(blocks: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(blocks) // 4}I", blocks))


def block_crcs_of(data: memoryview | bytes | bytearray) -> bytes:
    """Packed block CRCs of content ``data`` (from offset 0)."""
    mv = memoryview(data)
    out = bytearray(4 * block_count(len(mv)))
    for i, pos in enumerate(range(0, len(mv), BLOCK_BYTES)):
        struct.pack_into("<I", out, 4 * i, crc32c.crc32c(mv[pos : pos + BLOCK_BYTES]))
    return bytes(out)


def restage_blocks(
    old: bytes, old_len: int, new_len: int, lo: int, hi: int, crc_of: Callable[[int, int, int], int]
) -> bytes:
    """Block CRCs of a new version made from one of ``old_len`` bytes (block CRCs ``old``) by
    changing bytes [lo, hi) and setting the length to ``new_len``. Only the blocks that overlap
    [lo, hi) or whose extent changed are recomputed, with ``crc_of(index, start, end)`` (the new
    content's block [start, end)); every other block keeps its CRC."""
    nb = block_count(new_len)
    out = bytearray(old[: 4 * nb])
    if len(out) < 4 * nb:
        out += bytes(4 * nb - len(out))
    spans = [(lo // BLOCK_BYTES, min(nb, block_count(hi)))] if hi > lo else []
    if old_len != new_len:  # the block holding the old/new end changed its extent; new blocks
        spans.append((min(old_len, new_len) // BLOCK_BYTES, nb))
    done = 0
    for first, end in sorted(spans):
        for i in range(max(first, done), end):
            start = i * BLOCK_BYTES
            struct.pack_into("<I", out, 4 * i, crc_of(i, start, min(start + BLOCK_BYTES, new_len)))
        done = max(done, end)
    return bytes(out)


def _crc_span(value: int, start: int, end: int, data: memoryview, data_off: int) -> int:
    """Continue ``value`` over bytes [start, end) of a region that is zeros except ``data`` at
    ``data_off``."""
    data_end = data_off + len(data)
    if start < min(end, data_off):
        count = min(end, data_off) - start
        value = _ZERO_BLOCK_CRC if value == 0 and count == BLOCK_BYTES else crc_zeros(count, value)
        start += count
    if start < min(end, data_end):
        value = crc32c.crc32c(data[start - data_off : min(end, data_end) - data_off], value)
        start = min(end, data_end)
    if start < end:
        count = end - start
        value = _ZERO_BLOCK_CRC if value == 0 and count == BLOCK_BYTES else crc_zeros(count, value)
    return value


def extend_blocks(
    old: bytes, old_len: int, new_len: int, data: memoryview | bytes | bytearray, data_off: int
) -> bytes:
    """Block CRCs after growing content of ``old_len`` bytes (block CRCs ``old``) to ``new_len``:
    the new bytes are zeros except ``data`` at ``data_off`` (an append, a write past the end, a
    zero-extending truncate). No old byte is read again: the old short last block's CRC is
    continued over the bytes that join it."""
    mv = memoryview(data)

    def crc_of(i: int, start: int, end: int) -> int:
        if start < old_len:
            return _crc_span(block_crc(old, i), old_len, end, mv, data_off)
        return _crc_span(0, start, end, mv, data_off)

    return restage_blocks(old, old_len, new_len, old_len, new_len, crc_of)


@functools.cache
def _block_shift_table() -> array.array[int]:
    """Byte tables (4 x 256, flat) of the GF(2)-linear map G(v) = crc32c(BLOCK_BYTES zeros, v) ^
    crc32c(BLOCK_BYTES zeros): since crc32c(X, v) = crc32c(X) ^ G(v) for any whole block X, a
    whole-chunk CRC is carried over a block from that block's own CRC (32 hashes of a block of
    zeros to build, once). Packed uint32s: 4 KiB that stay cache-friendly next to a 4 MiB copy."""
    cols = [crc_zeros(BLOCK_BYTES, 1 << k) ^ _ZERO_BLOCK_CRC for k in range(32)]
    table = array.array("I", bytes(4 * 1024))
    for j in range(4):
        for b in range(1, 256):
            low = b & -b
            table[256 * j + b] = table[256 * j + (b ^ low)] ^ cols[8 * j + low.bit_length() - 1]
    return table


def crc_join_blocks(value: int, blocks: list[int]) -> int:
    """CRC32C of content whose CRC32C is ``value`` followed by whole BLOCK_BYTES blocks whose own
    CRC32Cs are ``blocks`` (no byte hashed again: four table lookups a block)."""
    t = _block_shift_table()
    for block in blocks:
        value = (block ^ t[value & 0xFF] ^ t[256 + ((value >> 8) & 0xFF)] ^ t[512 + ((value >> 16) & 0xFF)]
                 ^ t[768 + (value >> 24)])
    return value


def crc_of_blocks(blocks: bytes, length: int) -> int:
    """The CRC32C of content of ``length`` bytes from its packed block CRCs (no byte read): the
    whole blocks are joined by table, the short last one (``t`` bytes) through the CRC of ``t``
    zero bytes, since crc32c(X, v) = crc32c(X) ^ crc32c(zeros(t), v) ^ crc32c(zeros(t))."""
    crcs = unpack_blocks(blocks)
    tail = length % BLOCK_BYTES
    value = crc_join_blocks(0, crcs[:-1] if tail else crcs)
    if tail:
        value = crcs[-1] ^ crc_zeros(tail, value) ^ crc_zeros(tail)
    return value


def block_mismatch(key: ChunkKey, i: int, stored: int, computed: int, why: str = "") -> StatusError:
    return StatusError(
        Status.CHECKSUM_MISMATCH,
        f"chunk {key} block {i} at offset {i * BLOCK_BYTES}: CRC mismatch "
        f"(stored {stored:08x}, computed {computed:08x}){why}",
    )


def check_blocks(key: ChunkKey, blocks: bytes, first: int, view: memoryview, why: str = "") -> None:
    """Raise CHECKSUM_MISMATCH unless every block of ``view`` (the content from the start of
    block ``first``, whole blocks but for the chunk's short last one) matches its stored CRC."""
    for j, pos in enumerate(range(0, len(view), BLOCK_BYTES)):
        computed = crc32c.crc32c(view[pos : pos + BLOCK_BYTES])
        stored = block_crc(blocks, first + j)
        if computed != stored:
            raise block_mismatch(key, first + j, stored, computed, why)


def kept_blocks(old_len: int, lo: int, hi: int) -> tuple[tuple[range, range], list[int]]:
    """The blocks of committed content of ``old_len`` bytes that an update changing (or cutting
    away) bytes [lo, hi) keeps old bytes of: (the blocks entirely before and after [lo, hi), the
    blocks it covers only in part: at most two). A block covered whole keeps nothing."""
    nb = block_count(old_len)
    if hi <= lo or lo >= old_len:
        return (range(nb), range(nb, nb)), []
    first, last = lo // BLOCK_BYTES, (min(hi, old_len) - 1) // BLOCK_BYTES
    part = [first] if lo % BLOCK_BYTES else []
    if hi < min((last + 1) * BLOCK_BYTES, old_len) and last not in part:
        part.append(last)
    return (range(first), range(last + 1, nb)), part


def joined_block(old_len: int) -> list[int]:
    """The old block an update growing content of ``old_len`` bytes keeps bytes of (an append,
    a write past the end, a zero-extending truncate): the short last block, whose CRC it
    continues; none when the content is whole blocks. Its old bytes are checked first: a torn
    tail (a crash in the middle of the last commit) carried into a new version that only this
    replica holds could never be repaired (simulator seed 227082)."""
    return [old_len // BLOCK_BYTES] if old_len % BLOCK_BYTES else []


def first_changed(blocks: bytes, computed: bytes, kept: tuple[range, ...]) -> int:
    """The first block of ranges ``kept`` whose CRC differs between two packed block CRC lists,
    or -1 (whole ranges compared at once: the common case is no difference)."""
    for r in kept:
        span = slice(4 * r.start, 4 * r.stop)
        if blocks[span] != computed[span]:
            return next(i for i in r if blocks[4 * i : 4 * i + 4] != computed[4 * i : 4 * i + 4])
    return -1


def kept_why(version: int) -> str:
    """What a refused stage adds to its CHECKSUM_MISMATCH message."""
    return f"; update v{version} would keep its bytes: refused (the chunk needs a repair: a full replace)"


def bad_blocks(blocks: bytes, computed: bytes) -> list[int]:
    """Indexes whose CRC differs between two packed block CRC lists of the same content."""
    return [i for i in range(len(blocks) // 4) if blocks[4 * i : 4 * i + 4] != computed[4 * i : 4 * i + 4]]


def check_stage_version(state: ChunkState | None, key: ChunkKey, version: int) -> None:
    committed = state.commit_ver if state is not None else 0
    if version <= committed:
        raise StatusError(
            Status.VERSION_MISMATCH, f"chunk {key}: update v{version} is not newer than committed v{committed}"
        )


def check_range(offset: int, length: int) -> None:
    if offset < 0 or length < 0:
        raise InvalidArgument(f"bad range offset={offset} length={length}")


def no_pending(key: ChunkKey, version: int) -> NotFound:
    return NotFound(f"chunk {key}: no pending update v{version}")


def missing_chunk(key: ChunkKey) -> NotFound:
    return NotFound(f"chunk {key} has no committed version")

