"""The chunk engine's value types and limits (see ``base`` for the seam and its rules)."""

from __future__ import annotations

from dataclasses import dataclass

INDEX_END = 1 << 62
BLOCK_BYTES = 64 << 10  # unit of the per-block CRC32Cs
TAGS_MAX = 32  # request tags (one per client: its last request) kept per chunk version, oldest first
_ZEROS = bytes(1 << 20)


@dataclass(frozen=True, slots=True, order=True)
class ChunkKey:
    inode: int
    index: int

    def __str__(self) -> str:
        return f"{self.inode:x}/{self.index}"


@dataclass(frozen=True, slots=True)
class ChunkTag:
    """One client request that produced an update: (client, request) -> the version it made."""

    client_id: int
    request_id: int
    version: int  # the update version this request produced


@dataclass(frozen=True, slots=True)
class ChunkState:
    """What the engine knows about one chunk (committed part + the pending update, if any)."""

    key: ChunkKey
    commit_ver: int = 0  # 0 = never committed (only a pending update exists)
    length: int = 0  # committed length
    crc: int = 0  # CRC32C of the committed content
    pending_ver: int = 0  # 0 = none
    pending_length: int = 0
    pending_crc: int = 0
    tags: tuple[ChunkTag, ...] = ()  # the committed version's request tags, oldest first
    pending_tags: tuple[ChunkTag, ...] = ()  # what the pending version will carry; () = none

    @property
    def has_pending(self) -> bool:
        return self.pending_ver > self.commit_ver


@dataclass(frozen=True, slots=True)
class Usage:
    used_bytes: int = 0
    chunk_count: int = 0
    capacity_bytes: int = 0

