"""The packer: many small files -> shards of about ``shard_bytes`` each, with the index
(``index.json`` + one ``.idx`` per shard); and ``unpack``, the way back.

Files become samples the WebDataset way: ``DIR/cat/001.jpg`` and ``DIR/cat/001.cls`` under the
source directory are the sample ``cat/001`` with fields ``jpg`` and ``cls``. Input is sorted,
so shards (and keys across them) come out in key order and ``index.json`` says
``keys_sorted``. A shard is written under a temporary name and renamed when complete;
``index.json`` is written last, so a dataset with one is whole.
"""

from __future__ import annotations

import logging
import posixpath
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, BinaryIO

from loomfs.shards.errors import ShardCorrupt
from loomfs.shards.formats import SUFFIXES, format_of, writer_for
from loomfs.shards.index import MANIFEST_NAME, Manifest, ShardEntry, ShardIndex
from loomfs.shards.io import check_count, iter_shard
from loomfs.shards.store import Store, is_glob
from loomfs.shards.tar import split_name

logger = logging.getLogger(__name__)

DEFAULT_SHARD_BYTES = 256 << 20
READ_BATCH_FILES = 256
READ_BATCH_BYTES = 32 << 20
WRITE_BUFFER_BYTES = 8 << 20
PARTIAL_SUFFIX = ".partial"

Progress = Callable[[int, int], None]  # (samples done, bytes done)


@dataclass(frozen=True, slots=True)
class PackResult:
    manifest: Manifest
    seconds: float

    @property
    def samples(self) -> int:
        return self.manifest.samples

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.manifest.shards)


class _BufferedWriter:
    """Coalesces small writes into large ones (a LoomFS file write is a trip to the loop)."""

    def __init__(self, f: BinaryIO, buffer_bytes: int = WRITE_BUFFER_BYTES):
        self._f = f
        self._buf = bytearray()
        self._limit = buffer_bytes

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self._buf += data
        if len(self._buf) >= self._limit:
            self.flush()
        return len(data)

    def flush(self) -> None:
        if self._buf:
            self._f.write(bytes(self._buf))
            self._buf.clear()

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._f.close()


def source_root(store: Store, source: str | Sequence[str], files: list[str]) -> str:
    """The directory keys are relative to: the source directory, a glob's fixed part, or the
    common parent of a list of files."""
    if isinstance(source, str):
        if is_glob(source):
            parts = source.split("/")
            fixed = 0
            while fixed < len(parts) - 1 and not is_glob(parts[fixed]):
                fixed += 1
            return "/".join(parts[:fixed]) or ("/" if source.startswith("/") else "")
        if store.isdir(source):
            return source
    parents = {posixpath.dirname(f) for f in files}
    return posixpath.commonpath(sorted(parents)) if parents else ""


def plan_samples(store: Store, source: str | Sequence[str]) -> list[tuple[str, list[tuple[str, str]]]]:
    """``[(key, [(field, path), ...]), ...]`` in key order."""
    files = store.expand(source)
    root = source_root(store, source, files)
    named: list[tuple[str, str, str]] = []
    for path in files:
        rel = posixpath.relpath(path, root) if root else path
        if rel.startswith("../"):
            raise ValueError(f"{path} is outside the source root {root}")
        key, field = split_name(rel)
        named.append((key, field, path))
    named.sort()
    out: list[tuple[str, list[tuple[str, str]]]] = []
    for key, field, path in named:
        if out and out[-1][0] == key:
            if out[-1][1][-1][0] == field:
                raise ValueError(f"two files give sample {key!r} the field {field!r}: {path}")
            out[-1][1].append((field, path))
        else:
            out.append((key, [(field, path)]))
    return out


def _batches(plan: list[tuple[str, list[tuple[str, str]]]]) -> Iterator[list[tuple[str, list[tuple[str, str]]]]]:
    i = 0
    while i < len(plan):
        batch: list[tuple[str, list[tuple[str, str]]]] = []
        files = 0
        while i < len(plan) and files < READ_BATCH_FILES:
            batch.append(plan[i])
            files += len(plan[i][1])
            i += 1
        yield batch


def _read_samples(store: Store, plan: list[tuple[str, list[tuple[str, str]]]]
                  ) -> Iterator[tuple[str, dict[str, bytes]]]:
    """Samples' bytes, a batch of files per call (one ``read_many`` on LoomFS); the next
    batch is read on a thread while this one is written."""
    def read(batch: list[tuple[str, list[tuple[str, str]]]]) -> tuple[list[str], list[bytes | OSError]]:
        paths = [p for _, fields in batch for _, p in fields]
        return paths, store.read_many(paths)

    with ThreadPoolExecutor(1, thread_name_prefix="loomfs-pack-read") as pool:
        batches = _batches(plan)
        first = next(batches, None)
        pending = pool.submit(read, first) if first is not None else None
        batch = first
        while pending is not None and batch is not None:
            paths, results = pending.result()
            nxt = next(batches, None)
            pending = pool.submit(read, nxt) if nxt is not None else None
            datas = iter(zip(paths, results, strict=True))
            for key, fields in batch:
                sample: dict[str, bytes] = {}
                for field, _ in fields:
                    path, data = next(datas)
                    if isinstance(data, OSError):
                        if not data.filename:
                            data.filename = store.url(path)
                        raise data
                    sample[field] = data
                yield key, sample
            batch = nxt


def pack(src: Store, source: str | Sequence[str], dst: Store, dest: str, *, fmt: str = "tar",
         shard_bytes: int = DEFAULT_SHARD_BYTES, prefix: str = "shard-",
         progress: Progress | None = None) -> PackResult:
    """Pack the files of ``source`` (a directory, glob or list in ``src``) into shards in the
    directory ``dest`` of ``dst``; refuses a ``dest`` that already holds a packed dataset."""
    if fmt not in SUFFIXES:
        raise ValueError(f"unknown format {fmt!r} (tar, tfrecord or records)")
    if shard_bytes <= 0:
        raise ValueError("shard size must be positive")
    t0 = time.monotonic()
    plan = plan_samples(src, source)
    if not plan:
        raise FileNotFoundError(f"no files to pack in {source}")
    dst.makedirs(dest)
    manifest_path = dst.join(dest, MANIFEST_NAME)
    if dst.exists(manifest_path):
        raise FileExistsError(17, "a packed dataset is already there (remove it first)", dst.url(manifest_path))
    suffix = SUFFIXES[fmt][0]
    entries: list[ShardEntry] = []
    state: dict[str, Any] = {}
    done_samples = done_bytes = 0

    def start_shard() -> None:
        name = f"{prefix}{len(entries):06d}{suffix}"
        path = dst.join(dest, name)
        f = _BufferedWriter(dst.open_write(path + PARTIAL_SUFFIX))
        state.update(name=name, path=path, file=f, writer=writer_for(fmt, f), index=[])

    def finish_shard() -> None:
        writer, f, index = state["writer"], state["file"], state["index"]
        writer.close()
        f.close()
        path = state["path"]
        dst.rename(path + PARTIAL_SUFFIX, path)
        with dst.open_write(path + ".idx") as out:
            out.write(ShardIndex.build(state["name"], index).encode())
        entries.append(ShardEntry(name=state["name"], samples=len(index), bytes=writer.offset,
                                  first_key=index[0][0], last_key=index[-1][0]))
        logger.info("packed %s: %d samples, %d bytes", path, len(index), writer.offset)
        state.clear()

    for key, fields in _read_samples(src, plan):
        size = sum(len(v) for v in fields.values()) + 1024 * len(fields)
        if state and state["writer"].offset and state["writer"].offset + size > shard_bytes:
            finish_shard()
        if not state:
            start_shard()
        offset, length = state["writer"].write_sample(key, fields)
        state["index"].append((key, offset, length))
        done_samples += 1
        done_bytes += length
        if progress is not None:
            progress(done_samples, done_bytes)
    finish_shard()
    manifest = Manifest(root=dest, format=fmt, shards=entries, keys_sorted=True)
    with dst.open_write(manifest_path) as out:
        out.write(manifest.encode())
    return PackResult(manifest, time.monotonic() - t0)


def shard_list(store: Store, source: str | Sequence[str]) -> tuple[list[str], Manifest | None]:
    """The shards of ``source``: a packed dataset's directory or index.json (in its order),
    or a directory/glob/list of shard files (sorted; other files skipped)."""
    if isinstance(source, str):
        manifest_path = source if source.endswith(".json") else store.join(source, MANIFEST_NAME)
        if (source.endswith(".json") or (not is_glob(source) and store.isdir(source))) and store.exists(manifest_path):
            m = Manifest.load(store, manifest_path)
            return [m.shard_path(store, i) for i in range(len(m.shards))], m
    known = tuple(s for ss in SUFFIXES.values() for s in ss)
    found = [p for p in store.expand(source) if p.lower().endswith(known)]
    if not found:
        raise FileNotFoundError(f"no shards (files ending {', '.join(known)}) in {source}")
    return found, None


def _safe_key(shard: str, offset: int, name: str) -> str:
    parts = name.split("/")
    if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in name:
        raise ShardCorrupt(shard, offset, f"unsafe sample name {name!r} (absolute, empty or with '..')")
    return name


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, list):  # a TFRecord int64/float list (or several byte strings)
        if all(isinstance(v, bytes) for v in value):
            return b"".join(value)
        return " ".join(repr(v) for v in value).encode()
    return str(value).encode()


def unpack(src: Store, source: str | Sequence[str], dst: Store, dest: str, *,
           progress: Progress | None = None) -> int:
    """Write every sample's fields back as files ``dest/KEY.FIELD``; returns the sample count."""
    shards, manifest = shard_list(src, source)
    dst.makedirs(dest)
    made: set[str] = {dest}
    pending: dict[str, bytes] = {}
    pending_bytes = 0
    count = 0

    def flush() -> None:
        nonlocal pending_bytes
        if pending:
            dst.write_many(pending)
            pending.clear()
            pending_bytes = 0

    for i, path in enumerate(shards):
        fmt = manifest.format if manifest is not None else format_of(path)
        n = 0
        end = 0
        for key, fields, offset, length in iter_shard(src, path, fmt):
            _safe_key(src.url(path), offset, key)
            for field, value in fields.items():
                name = f"{key}.{field}" if field else key
                target = dst.join(dest, *name.split("/"))
                parent = posixpath.dirname(target)
                if parent not in made:
                    dst.makedirs(parent)
                    made.add(parent)
                data = _as_bytes(value)
                pending[target] = data
                pending_bytes += len(data)
            n += 1
            end = offset + length
            if len(pending) >= READ_BATCH_FILES or pending_bytes >= READ_BATCH_BYTES:
                flush()
            if progress is not None:
                progress(count + n, end)
        if manifest is not None:
            check_count(src.url(path), n, manifest.shards[i].samples, end)
        count += n
    flush()
    return count
