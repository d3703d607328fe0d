"""The DataLoader benchmark (issue 9 item 6): PyTorch ``DataLoader`` samples/s over LoomFS and
over a local directory, in the same run.

For each dataset shape (default 20,000 x 4 KiB and 10,000 x 112 KiB files in ``dirs``
directories), on each side:

* ``dl_files_<size>_<w>w``: whole files in random order (a seeded ``shuffle=True``), batches
  of ``batch_size``, ``w`` workers. LoomFS: ``loomfs.torch.LoomFileDataset`` (a batch is one
  ``read_many``); local: a plain map-style dataset whose ``ds[i]`` opens and reads file ``i``.
* ``dl_shards_<size>_<w>w``: the same files packed into WebDataset tar shards of about
  ``shard_bytes`` (``loomfs.shards.pack``), streamed by ``loomfs.torch.LoomShardDataset``
  (shuffled shard order and a 1,000-sample buffer) on both sides.

Every batch becomes one ``uint8`` tensor (``batch_size x file size``), as a decoding
``collate_fn`` would make, so both sides pay the same to move batches out of the workers.
Before each run the data is made cold as far as an unprivileged process can: local files (and
the cluster's own files, when the cluster runs from a local directory as with ``--start``) are
flushed (``os.sync``) and dropped from the page cache with ``posix_fadvise(DONTNEED)``;
LoomFS readers are fresh clients. Dentries and inodes stay cached.

Rows are samples/s (MB/s of file payload in ``extra``). A LoomFS target gets its local rows as
``dl_local_*`` beside it; its file rows are held against the local row of the same shape (the
issue's target: >= 0.5), its shard rows against the cold-read limit min(disk read, loopback
TCP) measured in the same run, in samples/s (target >= 0.8). Each row also says how it compares
with a stated consumer rate (``consumer_rate`` samples/s per GPU): a loader faster than its
consumer leaves no GPU idle. Targets are information, not assertions.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loomfs.bench.targets import BenchTarget
from loomfs.bench.workloads import Result
from loomfs.cli.common import human_bytes
from loomfs.shards.store import LocalStore, LoomStore, Store, close_clients

KINDS = ("files", "shards")
TARGET_RATIOS = {"files": 0.5, "shards": 0.8}  # of the local row / of the cold-read limit
SHUFFLE_BUFFER = 1000
WRITE_BATCH_BYTES = 32 << 20
WRITE_BATCH_FILES = 1000
WORKER_TIMEOUT_S = 300.0  # a batch that takes longer means a stuck worker
FIELD = "bin"  # files are d000/f0000000.bin: WebDataset key d000/f0000000, field "bin"


def label(size_bytes: int) -> str:
    return f"{size_bytes >> 10}k" if size_bytes >= 1024 else f"{size_bytes}b"


def row_names(sets: Sequence[tuple[int, int]], workers: Sequence[int], *, with_local: bool) -> list[str]:
    """The rows ``run_dataloader`` returns, in order (``with_local``: a LoomFS target)."""
    prefixes = ("", "local_") if with_local else ("",)
    return [f"dl_{p}{kind}_{label(size)}_{w}w" for _, size in sets for w in workers for kind in KINDS
            for p in prefixes]


def steps(sets: int, workers: int) -> int:
    """Progress steps per target: write and pack each set, then each (kind, workers) run."""
    return sets * (2 + len(KINDS) * workers)


def check_torch() -> str | None:
    """None when torch imports, else why not (the group is skipped or refused)."""
    try:
        import torch.utils.data  # noqa: F401
    except ImportError as exc:
        return f"the dataloader benchmark needs torch (pip install loomfs[torch]): {exc}"
    return None


# --- what the DataLoader runs (module level: workers get them by fork or spawn) -------------


class LocalFiles:
    """A plain map-style dataset over local files, as one writes it by hand: ``ds[i]`` opens
    and reads file ``i``."""

    def __init__(self, paths: Sequence[str]):
        self.paths = list(paths)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> bytes:
        with open(self.paths[i], "rb") as f:
            return f.read()

    def __repr__(self) -> str:
        return f"LocalFiles({len(self.paths)} files)"


def payload(sample: dict[str, Any]) -> bytes:
    """The file's bytes out of a shard sample."""
    data: bytes = sample[FIELD]
    return data


def to_tensor(batch: list[bytes]) -> Any:
    """A batch of equal-sized samples as one ``uint8`` tensor, one row per sample."""
    import torch

    buf = bytearray().join(batch)
    return torch.frombuffer(buf, dtype=torch.uint8).view(len(batch), -1)


# --- sides: where a dataset lives ----------------------------------------------------------


@dataclass
class Side:
    """One copy of the datasets: on LoomFS (``address``) or in a local directory."""

    prefix: str  # row name part: "" or "local_"
    store: Store
    root: str  # directory in ``store`` holding this side's datasets
    address: str | None = None  # LoomFS cluster (a mgmtd address or cluster directory)
    values: dict[str, float] = field(default_factory=dict)

    @property
    def loom(self) -> bool:
        return self.address is not None

    def path(self, *parts: str) -> str:
        return "/".join((self.root.rstrip("/"), *parts))

    def cold(self, path: str) -> dict[str, Any]:
        """Empty the caches in front of ``path`` (see the module doc): for LoomFS, a fresh
        client next and the cluster's files dropped when it runs from a local directory."""
        if self.loom:
            close_clients()  # the next dataset use connects a fresh client
            where = self.address or ""
            dropped = drop_tree(where) if os.path.isdir(where) else 0
            return {"fresh_client": True, "cluster_files_dropped": dropped}
        return {"files_dropped": drop_tree(path)}


def drop_tree(root: str) -> int:
    """Flush everything (``os.sync``), then drop every regular file below ``root`` from the page
    cache; returns how many files were dropped (best effort: 0 where fadvise is missing)."""
    if not hasattr(os, "posix_fadvise"):
        return 0
    os.sync()
    n = 0
    for d, _dirs, files in os.walk(root):
        for name in files:
            try:
                fd = os.open(os.path.join(d, name), os.O_RDONLY | os.O_NOFOLLOW)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                n += 1
            except OSError:
                pass
            finally:
                os.close(fd)
    return n


def file_paths(base: str, files: int, dirs: int) -> list[str]:
    """``files`` paths in sorted (directory) order: file i lives in directory i * dirs // files."""
    return [f"{base}/d{i * dirs // files:03d}/f{i:07d}.{FIELD}" for i in range(files)]


def write_files(store: Store, paths: list[str], size_bytes: int, seed: int) -> None:
    """Each file ``size_bytes`` of its own slice of a random pool, written in batches."""
    for d in sorted({p.rsplit("/", 1)[0] for p in paths}):
        store.makedirs(d)
    pool = os.urandom(max(2 * size_bytes, 1 << 20))
    span = len(pool) - size_bytes
    per_batch = max(1, min(WRITE_BATCH_FILES, WRITE_BATCH_BYTES // size_bytes))
    for lo in range(0, len(paths), per_batch):
        items = {}
        for i in range(lo, min(len(paths), lo + per_batch)):
            off = (i * 4099 + seed) % span
            items[paths[i]] = pool[off:off + size_bytes]
        store.write_many(items)


def run_loader(dataset: Any, *, workers: int, batch_size: int, shuffle: bool, seed: int,
               expect_samples: int, sample_bytes: int) -> dict[str, float]:
    """One epoch through a ``DataLoader``: samples/s and payload bytes/s from creating the
    iterator (worker start included) to the last batch; checks every sample came once."""
    import torch
    from torch.utils.data import DataLoader

    gen = torch.Generator()
    gen.manual_seed(seed)
    samples = nbytes = 0
    first_s = 0.0
    with warnings.catch_warnings():  # more workers than CPUs is what this run asks for
        warnings.filterwarnings("ignore", message=".*worker processes in total", category=UserWarning)
        loader = DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, num_workers=workers,
                            collate_fn=to_tensor, generator=gen,
                            timeout=WORKER_TIMEOUT_S if workers else 0)
        t0 = time.perf_counter()
        for batch in loader:
            if not samples:
                first_s = time.perf_counter() - t0
            samples += int(batch.shape[0])
            nbytes += int(batch.numel())
        seconds = time.perf_counter() - t0
    if samples != expect_samples or nbytes != expect_samples * sample_bytes:
        raise RuntimeError(f"DataLoader over {dataset!r}: {samples} samples / {nbytes} bytes, "
                           f"expected {expect_samples} of {sample_bytes} bytes")
    return {"samples_per_s": samples / seconds, "payload_Bps": nbytes / seconds, "seconds": seconds,
            "first_batch_s": first_s}


def cold_read_limit(lim: Mapping[str, float], loom: bool, workers: int) -> tuple[str, float, dict[str, float]]:
    """The byte rate a cold shard stream cannot beat: min(disk read, loopback TCP) for LoomFS
    (one TCP stream for 0 workers, the two-stream figure for more), the disk for a local one."""
    if not loom:
        return "local disk", lim["disk_fsync_read_Bps"], {"disk_read_Bps": lim["disk_fsync_read_Bps"]}
    streams = 1 if workers <= 1 else 2
    tcp = lim["loopback_tcp_Bps" if streams == 1 else "loopback_tcp_2streams_Bps"]
    disk = lim["disk_read_Bps"]
    name = "disk" if disk <= tcp else f"TCP x{streams}"  # the smaller one binds
    return name, min(disk, tcp), {"disk_read_Bps": disk, "tcp_Bps": tcp}


def run_dataloader(t: BenchTarget, base: str, *, sets: Sequence[tuple[int, int]], workers: Sequence[int],
                   batch_size: int, shard_bytes: int, dirs: int, consumer_rate: float,
                   lim: Mapping[str, float], local_dir: str, step: Callable[[str], None],
                   tag: str = "", seed: int = 13) -> list[Result]:
    """All DataLoader rows (``row_names``) for one target. A LoomFS target also runs the local
    copy in a fresh directory under ``local_dir``; both are removed at the end."""
    if (why := check_torch()) is not None:
        raise RuntimeError(why)
    from loomfs.shards.pack import pack
    from loomfs.torch import LoomFileDataset, LoomShardDataset

    kind, where = t.spec
    made = None
    if kind == "loomfs":
        made = tempfile.mkdtemp(prefix="bench-dl-", dir=local_dir)
        sides = [Side("", LoomStore(where), base, address=where), Side("local_", LocalStore(), made)]
    else:
        sides = [Side("", LocalStore(), os.path.join(where, base.lstrip("/")))]
    out: list[Result] = []
    try:
        for count, size in sets:
            lab = label(size)
            step(f"DataLoader: write {count} x {lab} files{tag}")
            files: dict[str, list[str]] = {}
            for s in sides:
                files[s.prefix] = file_paths(s.path(f"f{lab}"), count, max(1, min(dirs, count)))
                write_files(s.store, files[s.prefix], size, seed)
            step(f"DataLoader: pack {count} x {lab} into tar shards{tag}")
            packed: dict[str, tuple[float, int]] = {}  # side -> (shard bytes per sample, shards)
            for s in sides:
                res = pack(s.store, s.path(f"f{lab}"), s.store, s.path(f"s{lab}"), fmt="tar",
                           shard_bytes=shard_bytes)
                packed[s.prefix] = (res.bytes / res.samples, len(res.manifest.shards))
            close_clients()
            for w in workers:
                rates: dict[tuple[str, str], dict[str, Any]] = {}
                for kind_ in KINDS:
                    step(f"DataLoader: {kind_} {count} x {lab}, {w} worker(s){tag}")
                    for s in sides:
                        src = s.path(f"f{lab}" if kind_ == "files" else f"s{lab}")
                        ds: Any
                        if kind_ == "files":
                            ds = (LoomFileDataset(src, address=s.address) if s.loom
                                  else LocalFiles(files[s.prefix]))
                        else:
                            ds = LoomShardDataset(src if s.loom else Path(src), address=s.address,
                                                  transform=payload, shuffle=True,
                                                  shuffle_buffer=SHUFFLE_BUFFER, seed=seed)
                        how = s.cold(src)
                        r = run_loader(ds, workers=w, batch_size=batch_size, shuffle=kind_ == "files",
                                       seed=seed + w, expect_samples=count, sample_bytes=size)
                        close_clients()
                        rates[(s.prefix, kind_)] = {**r, **how}
                out += _rows(sides, rates, lab, count, size, w, batch_size, consumer_rate, lim, packed)
            for s in sides:
                _remove(t, s, [s.path(f"f{lab}"), s.path(f"s{lab}")])
    finally:
        close_clients()
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
    return out


def _remove(t: BenchTarget, s: Side, paths: list[str]) -> None:
    for p in paths:
        if s.loom:
            t.rmtree(p)
        else:
            shutil.rmtree(p, ignore_errors=True)


def _rows(sides: list[Side], rates: Mapping[tuple[str, str], Mapping[str, Any]], lab: str, count: int,
          size: int, workers: int, batch_size: int, consumer_rate: float, lim: Mapping[str, float],
          packed: Mapping[str, tuple[float, int]]) -> list[Result]:
    local = next((s for s in sides if not s.loom), None)
    out: list[Result] = []
    for kind in KINDS:
        for s in sides:
            r = rates[(s.prefix, kind)]
            v = float(r["samples_per_s"])
            extra: dict[str, Any] = {
                "files": count, "size_bytes": size, "workers": workers, "batch_size": batch_size,
                "cpus": os.cpu_count(),
                "MBps": r["payload_Bps"] / 1e6, **r, "consumer_rate": consumer_rate,
                "gpus_fed": v / consumer_rate if consumer_rate else None,
            }
            if kind == "files" and s.loom and local is not None:
                lname = f"local Dataset {workers}w"
                lval = float(rates[(local.prefix, "files")]["samples_per_s"])
                extra["target_ratio"] = TARGET_RATIOS["files"]
            elif kind == "files":
                lname = f"local disk / {lab}"
                lval = lim["disk_fsync_read_Bps"] / size
            else:
                name, bps, parts = cold_read_limit(lim, s.loom, workers)
                per_sample, shards = packed[s.prefix]
                lname = f"{name} {human_bytes(bps)}/s / {human_bytes(per_sample)}"
                lval = bps / per_sample
                extra.update(parts, cold_read_Bps=bps, shard_bytes_per_sample=per_sample,
                             shards=shards, shuffle_buffer=SHUFFLE_BUFFER)
                if s.loom:
                    extra["target_ratio"] = TARGET_RATIOS["shards"]
            out.append(Result(f"dl_{s.prefix}{kind}_{lab}_{workers}w", v, "samples/s", lname, lval, extra))
    return out


def target_check(row: Mapping[str, Any]) -> tuple[str, bool] | None:
    """The issue's target for a ``dl_`` row as (text, met), or None where it sets none."""
    want = row["extra"].get("target_ratio")
    if want is None:
        return None
    ratio = row.get("ratio")
    return f">= {want:g} of limit", ratio is not None and ratio >= want
