"""The packer's index: one ``index.json`` manifest per packed dataset and one binary ``.idx``
per shard.

``index.json``::

    {"loomfs_shards": 1, "format": "tar", "samples": N, "bytes": B, "keys_sorted": true,
     "shards": [{"name": "shard-000000.tar", "samples": n, "bytes": b,
                 "first_key": "...", "last_key": "..."}, ...]}

Shard names are relative to the manifest's directory; ``SHARD.idx`` sits beside each shard.
``keys_sorted`` says every shard's keys are in order and the shards' key ranges are too, so a
key is found by binary search (the packer sorts its input, so its output always is).

``.idx`` (little endian)::

    b"LOOMIDX1" | u64 count | u64 keys_bytes | u64 offsets[count] | u64 lengths[count]
               | u64 key_ends[count] | keys (UTF-8, concatenated)

``offsets[i]``/``lengths[i]``: the byte range of sample ``i`` in its shard (all of a tar
sample's members, or one framed record); ``key_ends`` cut the key blob into keys.
"""

from __future__ import annotations

import bisect
import json
import struct
import sys
from array import array
from dataclasses import asdict, dataclass
from typing import Any

from loomfs.shards.errors import ShardCorrupt, ShardError
from loomfs.shards.store import Store

MANIFEST_NAME = "index.json"
INDEX_SUFFIX = ".idx"
MANIFEST_VERSION = 1
_MAGIC = b"LOOMIDX1"
_HEAD = struct.Struct("<8sQQ")


def _u64(values: array[int]) -> bytes:
    if sys.byteorder == "big":
        values = array("Q", values)
        values.byteswap()
    return values.tobytes()


def _from_u64(data: bytes | memoryview) -> array[int]:
    out = array("Q")
    out.frombytes(data)
    if sys.byteorder == "big":
        out.byteswap()
    return out


class ShardIndex:
    """Keys and byte ranges of one shard's samples, in shard order."""

    def __init__(self, name: str, offsets: array[int], lengths: array[int],
                 key_ends: array[int], keys_blob: bytes):
        self.name = name
        self.offsets = offsets
        self.lengths = lengths
        self._key_ends = key_ends
        self._blob = keys_blob
        self._positions: dict[str, int] | None = None

    @classmethod
    def build(cls, name: str, entries: list[tuple[str, int, int]]) -> ShardIndex:
        """From ``(key, offset, length)`` per sample."""
        blob = bytearray()
        ends = array("Q")
        for key, _, _ in entries:
            blob += key.encode("utf-8", "surrogateescape")
            ends.append(len(blob))
        return cls(name, array("Q", (e[1] for e in entries)), array("Q", (e[2] for e in entries)),
                   ends, bytes(blob))

    def __len__(self) -> int:
        return len(self.offsets)

    def key(self, i: int) -> str:
        start = self._key_ends[i - 1] if i else 0
        return self._blob[start:self._key_ends[i]].decode("utf-8", "surrogateescape")

    def keys(self) -> list[str]:
        return [self.key(i) for i in range(len(self))]

    def position(self, key: str) -> int | None:
        if self._positions is None:
            self._positions = {k: i for i, k in enumerate(self.keys())}
        return self._positions.get(key)

    def span(self, first: int, stop: int) -> tuple[int, int]:
        """Byte range ``[start, end)`` covering samples ``first .. stop-1``."""
        if not 0 <= first < stop <= len(self):
            raise IndexError(f"{self.name}: samples {first}..{stop} out of 0..{len(self)}")
        return self.offsets[first], self.offsets[stop - 1] + self.lengths[stop - 1]

    def encode(self) -> bytes:
        return b"".join([_HEAD.pack(_MAGIC, len(self), len(self._blob)), _u64(self.offsets),
                         _u64(self.lengths), _u64(self._key_ends), self._blob])

    @classmethod
    def decode(cls, name: str, data: bytes) -> ShardIndex:
        if len(data) < _HEAD.size:
            raise ShardCorrupt(name, 0, f"index of {len(data)} bytes is too short")
        magic, count, blob_len = _HEAD.unpack_from(data)
        if magic != _MAGIC:
            raise ShardCorrupt(name, 0, "not a LoomFS shard index (bad magic)")
        want = _HEAD.size + 24 * count + blob_len
        if len(data) != want:
            raise ShardCorrupt(name, len(data), f"index should be {want} bytes for {count} samples")
        view = memoryview(data)
        p = _HEAD.size
        offsets = _from_u64(view[p:p + 8 * count])
        lengths = _from_u64(view[p + 8 * count:p + 16 * count])
        ends = _from_u64(view[p + 16 * count:p + 24 * count])
        if count and ends[-1] != blob_len:
            raise ShardCorrupt(name, p + 16 * count, "index key table does not match its keys")
        return cls(name, offsets, lengths, ends, bytes(view[want - blob_len:]))

    def __repr__(self) -> str:
        return f"ShardIndex({self.name!r} samples={len(self)})"


@dataclass(frozen=True, slots=True)
class ShardEntry:
    name: str
    samples: int
    bytes: int
    first_key: str = ""
    last_key: str = ""


@dataclass(slots=True)
class Manifest:
    """A packed dataset: its shards in order, with counts and key ranges."""

    root: str
    format: str
    shards: list[ShardEntry]
    keys_sorted: bool = False

    @property
    def samples(self) -> int:
        return sum(s.samples for s in self.shards)

    def shard_path(self, store: Store, i: int) -> str:
        return store.join(self.root, self.shards[i].name)

    def index_path(self, store: Store, i: int) -> str:
        return self.shard_path(store, i) + INDEX_SUFFIX

    def shard_of_key(self, key: str) -> int | None:
        """The only shard that can hold ``key`` (when ``keys_sorted``)."""
        if not self.keys_sorted:
            raise ValueError("keys are not sorted across shards")
        firsts = [s.first_key for s in self.shards]
        i = bisect.bisect_right(firsts, key) - 1
        if i < 0 or key > self.shards[i].last_key:
            return None
        return i

    def encode(self) -> bytes:
        doc: dict[str, Any] = {
            "loomfs_shards": MANIFEST_VERSION, "format": self.format, "samples": self.samples,
            "bytes": sum(s.bytes for s in self.shards), "keys_sorted": self.keys_sorted,
            "shards": [asdict(s) for s in self.shards],
        }
        return (json.dumps(doc, indent=1) + "\n").encode()

    @classmethod
    def decode(cls, root: str, name: str, data: bytes) -> Manifest:
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict) or "loomfs_shards" not in doc:
                raise ValueError("no 'loomfs_shards' version")
            if int(doc["loomfs_shards"]) > MANIFEST_VERSION:
                raise ValueError(f"version {doc['loomfs_shards']} is newer than this LoomFS reads")
            shards = [ShardEntry(name=str(s["name"]), samples=int(s["samples"]), bytes=int(s["bytes"]),
                                 first_key=str(s.get("first_key", "")), last_key=str(s.get("last_key", "")))
                      for s in doc["shards"]]
            return cls(root=root, format=str(doc["format"]), shards=shards,
                       keys_sorted=bool(doc.get("keys_sorted", False)))
        except (ValueError, KeyError, TypeError) as exc:
            raise ShardError(name, None, f"not a LoomFS shard manifest: {exc}") from None

    @classmethod
    def load(cls, store: Store, path: str) -> Manifest:
        """``path``: the manifest file, or the directory holding ``index.json``."""
        if not path.endswith(".json"):
            path = store.join(path, MANIFEST_NAME)
        root = path.rsplit("/", 1)[0] if "/" in path else "."
        return cls.decode(root or "/", store.url(path), store.read_bytes(path))

    def __repr__(self) -> str:
        return f"Manifest({self.root!r} format={self.format} shards={len(self.shards)} samples={self.samples})"


def load_index(store: Store, manifest: Manifest, i: int) -> ShardIndex:
    path = manifest.index_path(store, i)
    idx = ShardIndex.decode(store.url(path), store.read_bytes(path))
    if len(idx) != manifest.shards[i].samples:
        raise ShardCorrupt(store.url(path), None,
                           f"index lists {len(idx)} samples, the manifest {manifest.shards[i].samples}")
    return idx
