"""``LoomStorageReader``: torch.distributed.checkpoint's StorageReader on LoomFS.

Each rank reads only the items of its load plan. They are grouped per file, sorted by
offset, and split into ``threads`` runs of about equal bytes read concurrently (each run on
its own file handle, so the client's read-ahead follows it). A tensor that the plan wants
whole lands with ``readinto`` straight in the destination tensor's memory; a slice of one
(resharding) is read into a scratch tensor and copied.

On a ``LoomFS`` client the reads run as coroutines on the client's loop instead: every item
of a batch (up to ``batch_bytes`` of scratch) is read straight into its destination (``_readfiles``: a
chunk the batch wants whole in one READ into the items that cover it, the rest in pieces
within one chunk), ``inflight`` reads at a time, one hop from the caller's thread per batch;
the caller then checks and commits the batch.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import pickle
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from loomfs.checkpoint import _layout as L
from loomfs.checkpoint._format import ItemLoc, crc, dtype_of, tensor_bytes
from loomfs.checkpoint._holds import ReadHolds
from loomfs.checkpoint._readfiles import PIECE_MAX_BYTES, read_files
from loomfs.checkpoint._writer import _connect

logger = logging.getLogger(__name__)
# whole 16 MiB chunks in flight per rank. Cold 512 MiB loads, 8 MiB items, 5 rounds alternating
# (load average ~5 on 2 cores), medians: 8 in flight 1117 MiB/s, 12 1242, 16 1096
INFLIGHT = 12
__all__ = ["PIECE_MAX_BYTES", "ChecksumError", "LoomStorageReader", "picklable", "read_exact", "read_files"]


_Job = tuple[ReadItem, ItemLoc, Any, Any]  # item, where it lies, destination (None: bytes), read into


class ChecksumError(OSError):
    pass


def _read_metadata(fs: Any, ckpt: str) -> Metadata:
    md = pickle.loads(fs.cat(L.join(ckpt, L.METADATA_NAME)))
    if not isinstance(md, Metadata):
        raise ValueError(f"{ckpt}: .metadata is not a DCP Metadata")
    return md


def picklable(exc: Exception) -> Exception:
    """``exc``, or a built-in error of the same errno and text when it would not survive a
    pickle round trip: DCP gathers every rank's error by pickling it, and an error whose
    unpickling fails (``LoomError``'s keyword-only constructor) reaches every rank as a
    ``TypeError`` about ``__init__`` instead of the error."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        pass
    if isinstance(exc, OSError) and exc.errno is not None:
        return OSError(exc.errno, exc.strerror or str(exc), exc.filename)  # ENOENT: a FileNotFoundError
    return RuntimeError(f"{type(exc).__name__}: {exc}")


def read_exact(f: Any, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:
            raise EOFError(f"{getattr(f, 'name', f)}: short read ({got} of {len(view)} bytes)")
        got += n


class LoomStorageReader(StorageReader):
    """Reads a DCP checkpoint from LoomFS. ``path``: a checkpoint directory, or a run
    directory (its ``latest``, else its newest complete checkpoint)."""

    def __init__(self, path: str | os.PathLike[str], fs: Any = None, *, threads: int = 8,
                 verify: bool = False, inflight: int = INFLIGHT, batch_bytes: int = 1 << 30,
                 piece_bytes: int | None = PIECE_MAX_BYTES):
        super().__init__()
        self.path = os.fspath(path)
        self.fs = _connect(fs)
        self.threads = threads
        self.verify = verify
        self.inflight = inflight  # reads (whole chunks, or pieces of one) in flight on the loop
        self.piece_bytes = piece_bytes  # at most this much per piece (None: a whole chunk)
        self.batch_bytes = batch_bytes  # scratch (and bytes items) allocated per loop hop
        self.checkpoint_path: str | None = None
        self.storage_data: dict[Any, ItemLoc] = {}
        self._metadata: Metadata | None = None  # as this rank read it
        self._coordinator = True  # DCP's word, at set_up_storage_reader
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"LoomStorageReader({self.checkpoint_path or self.path!r})"

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)
        self.checkpoint_path = None
        self.storage_data = {}
        self._metadata = None

    def _dir(self) -> str:
        if self.checkpoint_path is None:
            self.checkpoint_path = L.resolve(self.fs, self.path)
        return self.checkpoint_path

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        try:
            md = self._metadata = _read_metadata(self.fs, self._dir())
        except Exception as exc:
            if (out := picklable(exc)) is exc:
                raise
            raise out from exc
        return md

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if metadata.storage_data is None:
            raise ValueError("checkpoint metadata has no storage_data")
        self.storage_data = metadata.storage_data
        self._coordinator = bool(is_coordinator)

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        """The coordinator's checkpoint goes to every rank with its plan: each rank resolved
        a run directory's ``latest`` on its own (DCP reads the metadata on every rank before
        any collective), and a save committed meanwhile would have split them."""
        chosen = self._dir()
        return [dataclasses.replace(p, storage_data=chosen) for p in plans]

    def _follow_coordinator(self, plan: LoadPlan) -> None:
        """Read what the coordinator resolved: its checkpoint must have this rank's structure
        (the same items, shapes and chunks), else the load fails here."""
        chosen = plan.storage_data
        if not isinstance(chosen, str):
            if self._coordinator or self.checkpoint_path == self.path:
                return  # the coordinator's own choice, or no choice (a checkpoint directory named)
            raise RuntimeError(f"the coordinator's checkpoint did not reach this rank (LoadPlan.storage_data is "
                               f"{type(chosen).__name__}: did the planner's finish_plan drop it?); this rank "
                               f"resolved {self.path} to {self.checkpoint_path} on its own, which may not be the "
                               "coordinator's: pass the checkpoint directory, not the run")
        if chosen == self.checkpoint_path:
            return
        md = _read_metadata(self.fs, chosen)
        mine = self._metadata
        if mine is None or md.storage_data is None or md.state_dict_metadata != mine.state_dict_metadata:
            raise RuntimeError(f"this rank resolved {self.checkpoint_path} but the coordinator {chosen}, and "
                               "their structures differ: pass the checkpoint directory, not the run")
        logger.info("%s resolved here, loading %s as the coordinator resolved", self.checkpoint_path, chosen)
        self.checkpoint_path, self.storage_data, self._metadata = chosen, md.storage_data, md

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        try:
            return self._read_data(plan, planner)
        except Exception as exc:
            if (out := picklable(exc)) is exc:
                raise
            raise out from exc

    def _read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        self._follow_coordinator(plan)
        if hasattr(self.fs, "loop") and hasattr(self.fs, "client"):
            self._read_on_loop(plan.items, planner)
            fut0: Future[None] = Future()
            fut0.set_result(None)
            return fut0
        runs = self._runs(plan.items)
        if runs:
            with ThreadPoolExecutor(max_workers=min(self.threads, len(runs)), thread_name_prefix="loomfs-ckpt-r") as pool:
                for _ in pool.map(lambda r: self._read_run(r[0], r[1], planner), runs):
                    pass
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    def _runs(self, items: list[ReadItem]) -> list[tuple[str, list[ReadItem]]]:
        per_file: dict[str, list[ReadItem]] = {}
        for item in items:
            per_file.setdefault(self.storage_data[item.storage_index].file, []).append(item)
        total = sum(self.storage_data[i.storage_index].length for i in items)
        target = max(1, total // max(1, self.threads))
        runs: list[tuple[str, list[ReadItem]]] = []
        for name, its in per_file.items():
            its.sort(key=lambda i: self.storage_data[i.storage_index].offset)
            cur: list[ReadItem] = []
            size = 0
            for it in its:
                cur.append(it)
                size += self.storage_data[it.storage_index].length
                if size >= target:
                    runs.append((name, cur))
                    cur, size = [], 0
            if cur:
                runs.append((name, cur))
        return runs

    def _read_run(self, name: str, items: list[ReadItem], planner: LoadPlanner) -> None:
        with self.fs.open(L.join(self._dir(), name), "rb") as f:
            for item in items:
                loc = self.storage_data[item.storage_index]
                f.seek(loc.offset)
                if item.type == LoadItemType.BYTE_IO:
                    buf = bytearray(loc.length)
                    read_exact(f, memoryview(buf))
                    self._check(loc, buf)
                    with self._lock:
                        planner.load_bytes(item, io.BytesIO(buf))
                    continue
                with self._lock:
                    dest = planner.resolve_tensor(item).detach()
                shape = torch.Size(loc.shape)
                dtype = dtype_of(loc.dtype)
                whole = (all(o == 0 for o in item.storage_offsets) and tuple(item.lengths) == tuple(shape)
                         and dest.dtype == dtype and dest.device.type == "cpu" and dest.is_contiguous()
                         and dest.shape == shape)
                if whole:
                    view = tensor_bytes(dest)
                    read_exact(f, view)
                    self._check(loc, view)
                else:
                    scratch = torch.empty(shape, dtype=dtype)
                    view = tensor_bytes(scratch)
                    read_exact(f, view)
                    self._check(loc, view)
                    part = narrow_tensor_by_index(scratch, item.storage_offsets, item.lengths)
                    if dest.size() != part.size():
                        raise ValueError(f"{item.storage_index}: size {tuple(part.size())} != {tuple(dest.size())}")
                    dest.copy_(part)
                with self._lock:
                    planner.commit_tensor(item, dest)

    def _read_on_loop(self, items: list[ReadItem], planner: LoadPlanner) -> None:
        """Every file of the plan opened under a read hold first, held until the last batch
        is read (a checkpoint pruned between batches still reads its own bytes), then closed.
        A batch ends once the reader's own buffers in it (scratch tensors, bytes items) reach
        ``batch_bytes``: items read straight into their destination tensors need none, so a
        load without resharding is one batch (one hop, no pause between batches)."""
        order = sorted(items, key=lambda i: (self.storage_data[i.storage_index].file,
                                             self.storage_data[i.storage_index].offset))
        holds = ReadHolds(self.fs.client)
        try:
            paths = [L.join(self._dir(), self.storage_data[i.storage_index].file) for i in order]
            self.fs.run(holds.open_all(paths))
            jobs: list[_Job] = []
            scratch = 0
            for item in order:
                job = self._job(item, planner)
                jobs.append(job)
                if job[3] is not job[2]:  # read into a buffer of the reader's own
                    scratch += job[1].length
                if scratch >= self.batch_bytes:
                    self._read_batch(jobs, planner, holds)
                    jobs, scratch = [], 0
            if jobs:
                self._read_batch(jobs, planner, holds)
        finally:
            self.fs.run(holds.close())

    def _job(self, item: ReadItem, planner: LoadPlanner) -> _Job:
        """The item, where it lies, its destination (None: a bytes item) and what it is read
        into: the destination tensor itself when the item is all of it, else a scratch tensor
        (a slice of the item: resharding; another dtype or device) or a bytes buffer."""
        loc = self.storage_data[item.storage_index]
        if item.type == LoadItemType.BYTE_IO:
            return item, loc, None, bytearray(loc.length)
        dest = planner.resolve_tensor(item).detach()
        shape, dtype = torch.Size(loc.shape), dtype_of(loc.dtype)
        whole = (all(o == 0 for o in item.storage_offsets) and tuple(item.lengths) == tuple(shape)
                 and dest.dtype == dtype and dest.device.type == "cpu" and dest.is_contiguous()
                 and dest.shape == shape)
        return item, loc, dest, dest if whole else torch.empty(shape, dtype=dtype)

    def _read_batch(self, jobs: list[_Job], planner: LoadPlanner, holds: ReadHolds | None = None) -> None:
        """Read every job's item on the loop at once, then check and commit them."""
        reads: dict[str, list[tuple[int, memoryview]]] = {}
        for _item, loc, _dest, into in jobs:
            view = memoryview(into) if isinstance(into, bytearray) else tensor_bytes(into)
            reads.setdefault(L.join(self._dir(), loc.file), []).append((loc.offset, view))
        self.fs.run(read_files(self.fs.client, reads, self.inflight, self.piece_bytes, holds))
        for item, loc, dest, into in jobs:
            if dest is None:
                self._check(loc, into)
                planner.load_bytes(item, io.BytesIO(into))
                continue
            self._check(loc, tensor_bytes(into))
            if into is not dest:
                part = narrow_tensor_by_index(into, item.storage_offsets, item.lengths)
                if dest.size() != part.size():
                    raise ValueError(f"{item.storage_index}: size {tuple(part.size())} != {tuple(dest.size())}")
                dest.copy_(part)
            planner.commit_tensor(item, dest)

    def _check(self, loc: ItemLoc, data: Any) -> None:
        if self.verify and crc(data) != loc.crc32c:
            raise ChecksumError(5, f"checksum mismatch at {loc.file}@{loc.offset}", self._dir())

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return False
