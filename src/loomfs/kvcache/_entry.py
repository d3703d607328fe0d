"""Index entries (pure): where a value lives, its CRC32C, its kind, when it was last touched.

One entry is one small inline file ``<prefix>/index/<name>`` in meta (``entry_name``). It
names the segment's inode, chunk size and chains, so a reader goes from the entry straight to
one chunk read, without asking meta about the segment. Values up to the cache's
``inline_value_max_bytes`` are carried inside the entry instead (no segment, one meta round
trip for put and get).

Layout (little endian)::

    magic u32 | version u8 | flags u8 | kind u8 | pad u8
    touched_s f64 | value_bytes u64 | value_crc u32
    seg_inode u64 | seg_offset u64 | chunk_size u32
    chains_n u16 | key_n u16 | desc_n u16 | seg_name_n u16
    chains u32 * chains_n | key | desc (utf-8) | seg_name (utf-8) | [inline value]
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
from dataclasses import dataclass

from loomfs.errors import InvalidArgument

MAGIC = 0x3156_4B4C  # "LKV1"
VERSION = 1
FLAG_INLINE = 1
KIND_BYTES, KIND_NUMPY, KIND_TORCH = 0, 1, 2
KEY_BYTES_MAX = 4096
HEX_NAME_KEY_BYTES_MAX = 100  # longer keys are named by their BLAKE2b hash (the entry holds the key)
CHAINS_MAX = 1024
_HEAD = struct.Struct("<IBBBBdQIQQIHHHH")
_HEAD_SIZE = _HEAD.size


class EntryError(ValueError):
    """Bytes that are not an entry of this format (treated as a miss by readers)."""


# not frozen: a frozen dataclass's __init__ sets each of the 12 fields through
# object.__setattr__ (3.4 us an entry vs 0.6; decoding a get's entries from meta is on the
# critical path of every batch). Nothing mutates an Entry: ``touched`` makes a new one.
@dataclass(slots=True)
class Entry:
    key: bytes
    touched_s: float  # wall-clock time of the last put or touch (TTL and LRU)
    value_bytes: int
    value_crc: int
    kind: int = KIND_BYTES
    desc: str = ""  # numpy/torch: "dtype;d0,d1,..."
    seg_name: str = ""
    seg_inode: int = 0
    seg_offset: int = 0
    chunk_size: int = 0
    chains: tuple[int, ...] = ()
    inline: bytes | None = None  # the value itself, when carried in the entry

    def touched(self, now_s: float) -> Entry:
        return dataclasses.replace(self, touched_s=now_s)

    def same_place(self, other: Entry) -> bool:
        """Whether ``other`` names the same stored bytes (compaction's check before moving)."""
        return (self.seg_inode, self.seg_offset, self.value_bytes, self.value_crc) == (
            other.seg_inode, other.seg_offset, other.value_bytes, other.value_crc)

    def same_value(self, other: Entry) -> bool:
        """Whether ``other`` holds the same value, wherever stored (a touch's check: a value
        compaction moved is still the one that was hit)."""
        return (self.key, self.value_bytes, self.value_crc, self.kind, self.desc, self.inline) == (
            other.key, other.value_bytes, other.value_crc, other.kind, other.desc, other.inline)


def check_key(key: object) -> bytes:
    if not isinstance(key, bytes | bytearray | memoryview):
        raise InvalidArgument(f"kvcache keys are bytes, not {type(key).__name__}")
    k = bytes(key)
    if not 0 < len(k) <= KEY_BYTES_MAX:
        raise InvalidArgument(f"kvcache key of {len(k)} bytes (1..{KEY_BYTES_MAX})")
    return k


def entry_name(key: bytes) -> str:
    """The index file name of ``key``: its hex, or ``h`` + a BLAKE2b-256 hash for long keys."""
    if len(key) <= HEX_NAME_KEY_BYTES_MAX:
        return key.hex()
    return "h" + hashlib.blake2b(key, digest_size=32).hexdigest()


def encode(e: Entry) -> bytes:
    desc = e.desc.encode()
    seg = e.seg_name.encode()
    flags = FLAG_INLINE if e.inline is not None else 0
    head = _HEAD.pack(MAGIC, VERSION, flags, e.kind, 0, e.touched_s, e.value_bytes, e.value_crc,
                      e.seg_inode, e.seg_offset, e.chunk_size, len(e.chains), len(e.key), len(desc), len(seg))
    parts = [head, struct.pack(f"<{len(e.chains)}I", *e.chains), e.key, desc, seg]
    if e.inline is not None:
        parts.append(e.inline)
    return b"".join(parts)


def decode(data: bytes | memoryview) -> Entry:
    """An entry from its bytes; EntryError for anything malformed (never trusts a length).
    The fields are sliced from one ``bytes`` copy of the entry (~100 bytes): cheaper than a
    memoryview slice and a copy per field (a get from meta decodes one entry per value)."""
    b = bytes(data)
    if len(b) < _HEAD_SIZE:
        raise EntryError(f"entry of {len(b)} bytes is shorter than its header")
    (magic, version, flags, kind, _pad, touched_s, value_bytes, value_crc, seg_inode, seg_offset,
     chunk_size, chains_n, key_n, desc_n, seg_n) = _HEAD.unpack_from(b)
    if magic != MAGIC or version != VERSION:
        raise EntryError(f"not a kvcache entry (magic {magic:#x} version {version})")
    if kind not in (KIND_BYTES, KIND_NUMPY, KIND_TORCH) or chains_n > CHAINS_MAX or not 0 < key_n <= KEY_BYTES_MAX:
        raise EntryError("kvcache entry header out of range")
    key_at = _HEAD_SIZE + 4 * chains_n
    desc_at = key_at + key_n
    seg_at = desc_at + desc_n
    end = seg_at + seg_n
    if end > len(b):
        raise EntryError("kvcache entry shorter than its fields")
    chains = _chains_struct(chains_n).unpack_from(b, _HEAD_SIZE)
    try:
        desc = b[desc_at:seg_at].decode() if desc_n else ""
        seg = b[seg_at:end].decode()
    except UnicodeDecodeError as exc:
        raise EntryError("kvcache entry text is not utf-8") from exc
    inline: bytes | None = None
    if flags & FLAG_INLINE:
        inline = b[end:]
        if len(inline) != value_bytes:
            raise EntryError(f"inline value of {len(inline)} bytes, entry says {value_bytes}")
    elif end != len(b) or chunk_size <= 0 or not chains:
        raise EntryError("kvcache entry without a place for its value")
    return Entry(b[key_at:desc_at], touched_s, value_bytes, value_crc, kind, desc, seg, seg_inode, seg_offset,
                 chunk_size, chains, inline)


_CHAINS_STRUCTS: dict[int, struct.Struct] = {}


def _chains_struct(n: int) -> struct.Struct:
    st = _CHAINS_STRUCTS.get(n)
    if st is None:
        st = struct.Struct(f"<{n}I")
        if len(_CHAINS_STRUCTS) < 64:
            _CHAINS_STRUCTS[n] = st
    return st
