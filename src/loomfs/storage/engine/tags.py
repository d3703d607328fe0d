"""Request tags of a chunk version, packed for the index (see ``base``: retry dedupe)."""

from __future__ import annotations

import struct

from loomfs.errors import InvalidArgument
from loomfs.storage.engine.types import TAGS_MAX, ChunkTag

# ---- request tags: packed as little-endian (u64 client, u64 request, u64 version) triples ---
_TAG = struct.Struct("<QQQ")


def tags_with(tags: tuple[ChunkTag, ...], tag: ChunkTag) -> tuple[ChunkTag, ...]:
    """``tags`` plus ``tag``, trimmed to the newest TAGS_MAX (the list a new version carries)."""
    return (*tags[-(TAGS_MAX - 1) :], tag)


class TagListCache:
    """Decoded tag lists by their packed bytes, for the chunks being written now: ``get`` runs
    several times per write (the service's check, stage, commit) and decoding 8 tags costs ~3 us,
    while engines keep tags packed (24 bytes a tag). ``encode_tags`` puts the list it was given, so
    a write decodes nothing. Bounded; the oldest entry goes first. Shared by every engine in the
    process (entries are immutable, keyed by content); plain dict operations only."""

    def __init__(self, entries_max: int = 4096):
        self.entries_max = entries_max
        self._lists: dict[bytes, tuple[ChunkTag, ...]] = {}
        self.hits = self.misses = 0

    def put(self, packed: bytes, tags: tuple[ChunkTag, ...]) -> None:
        if packed not in self._lists and len(self._lists) >= self.entries_max:
            self._lists.pop(next(iter(self._lists)), None)
        self._lists[packed] = tags

    def decode(self, packed: bytes) -> tuple[ChunkTag, ...]:
        if not packed:
            return ()
        tags = self._lists.get(packed)
        if tags is not None:
            self.hits += 1
            return tags
        self.misses += 1
        tags = tuple(ChunkTag(c, r, v) for c, r, v in _TAG.iter_unpack(packed))
        self.put(packed, tags)
        return tags

    def __repr__(self) -> str:
        return f"TagListCache(entries={len(self._lists)}/{self.entries_max} hits={self.hits} misses={self.misses})"


TAG_LISTS = TagListCache()


def encode_tags(tags: tuple[ChunkTag, ...]) -> bytes:
    """The newest TAGS_MAX of ``tags``, packed; InvalidArgument on a field outside u64."""
    if not tags:
        return b""
    tags = tuple(tags[-TAGS_MAX:])
    out = bytearray(_TAG.size * len(tags))
    try:
        for i, t in enumerate(tags):
            _TAG.pack_into(out, _TAG.size * i, t.client_id, t.request_id, t.version)
    except struct.error as exc:
        raise InvalidArgument(f"bad request tag in {tags}: {exc}") from exc
    packed = bytes(out)
    TAG_LISTS.put(packed, tags)
    return packed


def decode_tags(packed: bytes) -> tuple[ChunkTag, ...]:
    """Packed tags as ChunkTags (through ``TAG_LISTS``)."""
    return TAG_LISTS.decode(packed)


def tags_ok(packed: bytes) -> bool:
    """Is this a well-formed packed tag list (as stored)?"""
    return len(packed) % _TAG.size == 0 and len(packed) <= _TAG.size * TAGS_MAX

