"""The shard formats by name: file suffixes, writers and sample parsers."""

from __future__ import annotations

import posixpath
from collections.abc import Iterator
from typing import Any, Protocol

from loomfs.shards.reader import ByteReader, Sink
from loomfs.shards.records import RecordWriter, iter_record_samples
from loomfs.shards.tar import TarWriter, iter_tar_samples
from loomfs.shards.tfrecord import TFRecordWriter, iter_tfrecord_samples

SUFFIXES: dict[str, tuple[str, ...]] = {
    "tar": (".tar",),
    "tfrecord": (".tfrecord", ".tfrecords"),
    "records": (".rec",),
}
RawSample = tuple[str, dict[str, Any], int, int]  # key, fields, offset, length


class ShardWriter(Protocol):
    suffix: str
    offset: int
    samples: int

    def write_sample(self, key: str, fields: dict[str, bytes]) -> tuple[int, int]: ...

    def close(self) -> None: ...


def format_of(path: str) -> str:
    """The format a shard's name says (``.tar``, ``.tfrecord``/``.tfrecords``, ``.rec``)."""
    name = path.lower()
    for fmt, suffixes in SUFFIXES.items():
        if name.endswith(suffixes):
            return fmt
    known = ", ".join(s for ss in SUFFIXES.values() for s in ss)
    raise ValueError(f"{path}: unknown shard format (known suffixes: {known})")


def shard_stem(path: str) -> str:
    base = posixpath.basename(path)
    for suffixes in SUFFIXES.values():
        for s in suffixes:
            if base.lower().endswith(s):
                return base[: -len(s)]
    return base


def writer_for(fmt: str, f: Sink) -> ShardWriter:
    if fmt == "tar":
        return TarWriter(f)
    if fmt == "tfrecord":
        return TFRecordWriter(f)
    if fmt == "records":
        return RecordWriter(f)
    raise ValueError(f"unknown shard format {fmt!r} (tar, tfrecord or records)")


def iter_samples(fmt: str, r: ByteReader, *, first_index: int = 0,
                 parse_examples: bool = True) -> Iterator[RawSample]:
    """Samples of a shard's bytes (from ``r``'s start) as ``(key, fields, offset, length)``;
    ``first_index`` numbers the first one (record formats key samples by it)."""
    stem = shard_stem(r.shard)
    if fmt == "tar":
        return iter_tar_samples(r)
    if fmt == "tfrecord":
        return iter_tfrecord_samples(r, first_index, stem, parse_examples=parse_examples)
    if fmt == "records":
        return iter_record_samples(r, first_index, stem)
    raise ValueError(f"unknown shard format {fmt!r}")
