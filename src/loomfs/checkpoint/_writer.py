"""``LoomStorageWriter``: torch.distributed.checkpoint's StorageWriter on LoomFS.

One save: the coordinator names the checkpoint and creates a staging directory in
``prepare_global_plan`` (its name reaches every rank in ``SavePlan.storage_data``); every
rank writes its items into ``files_per_rank`` files on as many threads, tensors as raw bytes
straight from their memory, and fsyncs each file; the coordinator's ``finish`` writes
``.metadata`` and the manifest, fsyncs them, renames the staging directory to its final
name, then moves ``latest``. A crash before the rename leaves only a staging directory
(removed by the next save of the run, or ``prune``); after it, a complete checkpoint.

With ``local_dir``, ranks write to local disk and return; an ``Uploader`` copies the files
to LoomFS in the background and the coordinator's upload commits once every rank's
``.rank-N.done`` marker is there (``wait()`` before exit).

On a ``LoomFS`` client a rank's files are written by one coroutine per file on the client's
loop (one hop from the caller's thread for the whole rank, not one per item), while the
caller's thread computes the items' CRC32Cs meanwhile. For ``dcp.async_save`` the writer is
its own stager (``loomfs.checkpoint._staging``): the staged CPU copy is reused from one save
to the next.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import io
import json
import logging
import os
import pickle
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItem, WriteItemType
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult
from torch.futures import Future

from loomfs.checkpoint import _layout as L
from loomfs.checkpoint._format import (
    KIND_BYTES,
    KIND_TENSOR,
    ItemLoc,
    PlanInfo,
    crc,
    dtype_name,
    tensor_bytes,
)
from loomfs.checkpoint._heartbeat import DEFAULT_HEARTBEATS, Beat, Heartbeats, write_beat
from loomfs.checkpoint._staging import DEFAULT_STAGER, Stager
from loomfs.checkpoint._upload import Uploader, commit_job, done_marker, rank_upload_job

logger = logging.getLogger(__name__)

# The chunk size of a checkpoint's files. Each chunk costs every replica a fixed amount besides
# its bytes (a request and its forward, a new chunk file, its fsync, an index row), so bigger
# chunks cost less storage CPU per GiB; measured (1 rank, 1 GiB durable saves, one cluster,
# alternating): 4 MiB 4.75 storage CPU-s/GiB and 177 MiB/s, 16 MiB 3.05 and 213 MiB/s (medians
# of 3); 32 and 64 MiB were slower again (195 and 150 MiB/s against 291 for 16 MiB, 2 pairs).
CHUNK_BYTES = 16 << 20

# Tests set this to kill the process at a named point of a save: "staged", "item" (after each
# item's write), "written", "metadata", "renamed", "latest".
fault_point: Callable[[str], None] | None = None


def _fault(where: str) -> None:
    if fault_point is not None:
        fault_point(where)


def _connect(fs: Any) -> Any:
    if fs is not None:
        return fs
    import loomfs

    return loomfs.connect()


def _tensor_ids(obj: Any) -> set[int]:
    """The ids of the tensor objects in a (nested) state_dict."""
    out: set[int] = set()
    if isinstance(obj, torch.Tensor):
        out.add(id(obj))
    elif isinstance(obj, dict):
        for v in obj.values():
            out |= _tensor_ids(v)
    elif isinstance(obj, list | tuple):
        for v in obj:
            out |= _tensor_ids(v)
    return out


def _item_bytes(item: WriteItem) -> int:
    if item.type == WriteItemType.BYTE_IO or item.tensor_data is None:
        return 0
    n = 1
    for d in item.tensor_data.size:
        n *= d
    return n * item.tensor_data.properties.dtype.itemsize


def split_items(items: list[WriteItem], bins: int) -> list[list[WriteItem]]:
    """Items into at most ``bins`` groups of about equal bytes (largest first, greedy)."""
    groups: list[list[WriteItem]] = [[] for _ in range(max(1, bins))]
    sizes = [0] * len(groups)
    for item in sorted(items, key=_item_bytes, reverse=True):
        i = sizes.index(min(sizes))
        groups[i].append(item)
        sizes[i] += max(_item_bytes(item), 1)
    return [g for g in groups if g]


def _item_buffer(item: WriteItem, data: Any) -> tuple[WriteItem, memoryview, ItemLoc]:
    """The bytes to write for an item (kept alive with its tensor) and its location less
    the file, offset and CRC."""
    if item.type == WriteItemType.BYTE_IO:
        assert isinstance(data, io.BytesIO)
        buf = data.getbuffer()
        return item, buf, ItemLoc("", 0, len(buf), 0, KIND_BYTES)
    assert isinstance(data, torch.Tensor)
    t = plain_tensor(data, item)
    buf = tensor_bytes(t)
    return item, buf, ItemLoc("", 0, len(buf), 0, KIND_TENSOR, dtype_name(t.dtype), tuple(t.shape))


def plain_tensor(data: torch.Tensor, item: WriteItem | None = None) -> torch.Tensor:
    """A contiguous CPU tensor whose bytes are ``data``'s values. A lazy conj/neg bit is
    applied (its memory holds the unconjugated/unnegated values); a quantized tensor (its
    scale and zero point are not in the bytes) and a sparse one are refused."""
    where = f"{item.index.fqn}: " if item is not None else ""
    if data.is_quantized:
        raise ValueError(f"{where}quantized tensors cannot be saved (their scale and zero point are not "
                         "stored): save t.dequantize() or t.int_repr() with the qparams")
    if data.layout != torch.strided:
        raise ValueError(f"{where}{data.layout} tensors cannot be saved: save t.to_dense()")
    t = data.detach()
    t = t.cpu() if t.device.type != "cpu" else t
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    return t.contiguous()


async def write_files(client: Any, files: list[tuple[str, list[memoryview]]]) -> None:
    """Write each file's buffers in order, all files at once; fsync and close each."""

    async def one(path: str, bufs: list[memoryview]) -> None:
        f = await client.open(path, "wb")
        try:
            for buf in bufs:
                await f.write(buf)
                _fault("item")
            await f.fsync()
        finally:
            await f.close()

    outcomes = await asyncio.gather(*(one(p, b) for p, b in files), return_exceptions=True)
    for out in outcomes:
        if isinstance(out, BaseException):
            raise out


class LoomStorageWriter(StorageWriter):
    """Writes a DCP checkpoint to LoomFS, atomically.

    ``step`` given: ``path`` is a run directory and the checkpoint becomes
    ``path/step-000123-<UTC>`` with ``path/latest`` pointing at it. ``step`` None: ``path`` is
    the checkpoint directory itself (a ``checkpoint_id`` passed to ``dcp.save`` replaces it).
    The staging directory gets the ``durable`` layout flag and ``chunk_size`` (16 MiB; None
    keeps the run directory's).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        fs: Any = None,
        *,
        step: int | None = None,
        files_per_rank: int = 4,
        local_dir: str | os.PathLike[str] | None = None,
        uploader: Uploader | None = None,
        commit_timeout_s: float = 3600.0,
        durable: bool = True,
        stager: Stager | None = None,
        chunk_size: int | None = CHUNK_BYTES,
        heartbeats: Heartbeats | None = None,
    ):
        super().__init__()
        self.path = os.fspath(path)
        self.fs = _connect(fs)
        self.step = step
        self.files_per_rank = files_per_rank
        self.local_dir = os.fspath(local_dir) if local_dir is not None else None
        self.uploader = uploader if uploader is not None or local_dir is None else Uploader()
        self.commit_timeout_s = commit_timeout_s
        self.durable = durable  # the staging directory's files fsync on every replica (layout flag)
        self.chunk_size = chunk_size  # the staging directory's chunk size (None: the run directory's)
        self.is_coordinator = False
        self.rank = 0
        # one save's state, per thread: dcp.async_save runs each save on its own thread, and
        # saves through one writer may overlap (the second's reset must not touch the first's)
        self._save = threading.local()
        self.checkpoint_path: str | None = None  # set by finish (or the commit upload)
        self.stager = stager if stager is not None else DEFAULT_STAGER  # dcp.async_save's staging copies
        # staged copies no save has read yet: the stager's token -> the ids of the copy's tensor
        # objects (the token keeps them alive, so the ids stay theirs)
        self._staged: dict[object, frozenset[int]] = {}
        self._staged_lock = threading.Lock()
        # the saving ranks' heartbeats in the staging directory (a save in progress is never gc'd)
        self.heartbeats = heartbeats if heartbeats is not None else DEFAULT_HEARTBEATS

    def __repr__(self) -> str:
        return f"LoomStorageWriter({self.path!r}, step={self.step}, rank={self.rank})"

    @property
    def info(self) -> PlanInfo | None:
        """This thread's save's plan (None before ``write_data``)."""
        info: PlanInfo | None = getattr(self._save, "info", None)
        return info

    @info.setter
    def info(self, value: PlanInfo | None) -> None:
        self._save.info = value

    def _path(self) -> str:
        path: str = getattr(self._save, "path", None) or self.path
        return path

    # --- the AsyncStager protocol (dcp.async_save stages through the writer) ---------------

    _synchronize_after_execute = False  # stage() returns once the copy is done

    @property
    def should_synchronize_after_execute(self) -> bool:
        return self._synchronize_after_execute

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """A CPU copy of ``state_dict`` for ``dcp.async_save``, in memory reused across saves."""
        staged, token = self.stager.stage(state_dict)
        if token is not None:
            with self._staged_lock:
                self._staged[token] = frozenset(_tensor_ids(staged))
        return staged

    def synchronize_staging(self) -> None:
        """Nothing to wait for: ``stage`` copies before it returns."""

    def close(self) -> None:
        with self._staged_lock:
            tokens, self._staged = list(self._staged), {}
        for token in tokens:
            self.stager.release(token)

    def _claim_staged(self, planner: SavePlanner) -> object | None:
        """The token of the staged copy this save reads, taken out of ``_staged`` (None: not
        a save of a staged copy, or one this writer cannot tell). It is the copy whose tensor
        objects the planner was set up with (``planner.state_dict``, as ``DefaultSavePlanner``
        and its subclasses keep it: whatever ``resolve_data`` makes of them, a cast copy
        included, and whatever items this rank's plan holds). A planner that keeps no state
        claims nothing: with one copy staged it cannot tell its own async save from a sync save
        next to another's, and taking another save's copy lets the next ``stage`` overwrite
        buffers that save still reads (review, session 14); such copies stay busy until
        ``close``."""
        state = getattr(planner, "state_dict", None)
        with self._staged_lock:
            if not self._staged:
                return None
            if not isinstance(state, dict):
                return None
            ids = _tensor_ids(state)
            token = next((t for t, mine in self._staged.items() if mine & ids), None)
            if token is not None:
                del self._staged[token]
        return token

    # --- the StorageWriter protocol -------------------------------------------------------

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id is not None:
            self.path = self._save.path = os.fspath(checkpoint_id)
        self.info = None
        self.checkpoint_path = None

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator
        rank = kwargs.get("rank")
        if rank is None:
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        self.rank = int(rank)
        self.info = None

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        if self.step is not None:
            run, final_name = self._path(), L.step_name(self.step)
        else:
            path = self._path().rstrip("/")
            run, final_name = os.path.dirname(path) or "/", os.path.basename(path)
            if self.fs.exists(path):  # before any data is written (the commit rename would refuse)
                raise FileExistsError(17, "checkpoint directory exists (a plain save never replaces one)", path)
        self.fs.makedirs(run, exist_ok=True)
        staging = L.join(run, L.staging_name(final_name))
        self.fs.mkdir(staging)
        layout: dict[str, Any] = {}
        if self.durable:
            layout["durable"] = True  # its files inherit it: acked = on disk everywhere
        if self.chunk_size:
            layout["chunk_size"] = self.chunk_size
        if layout and hasattr(self.fs, "set_layout"):
            self.fs.set_layout(staging, **layout)
        write_beat(self.fs, L.join(staging, L.heartbeat_name(self.rank)))  # alive until write_data beats
        _fault("staged")
        final = L.join(run, final_name)
        return [
            dataclasses.replace(p, storage_data=PlanInfo(rank=i, world_size=len(plans), staging=staging, final=final))
            for i, p in enumerate(plans)
        ]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        info = plan.storage_data
        if not isinstance(info, PlanInfo):
            raise RuntimeError("LoomStorageWriter needs the coordinated save (use_collectives=True)")
        self.info = info
        token = self._claim_staged(planner)  # before the writes: this save's own copy
        beat = self.heartbeats.start(self.fs, L.join(info.staging, L.heartbeat_name(info.rank)))
        try:
            # a tiered save hands its heartbeat to its upload, which stops it
            results = self._write_items(info, split_items(plan.items, self.files_per_rank), planner, beat)
        except BaseException:
            beat.stop()
            raise
        finally:  # written (or failed): the staged copy may be reused
            if token is not None:
                self.stager.release(token)
        if self.local_dir is None:
            beat.stop()
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    def _write_items(self, info: PlanInfo, groups: list[list[WriteItem]], planner: SavePlanner,
                     beat: Beat | None = None) -> list[WriteResult]:
        names = [f"__{info.rank}_{i}.distcp" for i in range(len(groups))]
        if self.local_dir is None and hasattr(self.fs, "loop") and hasattr(self.fs, "client"):
            results = self._write_on_loop(info, names, groups, planner)
            _fault("written")
            return results
        # one directory per rank: ranks of a host may share local_dir, and each uploader
        # deletes its own files once uploaded
        local = (os.path.join(self.local_dir, os.path.basename(info.staging), f"rank-{info.rank}")
                 if self.local_dir else None)
        if local is not None:
            os.makedirs(local, exist_ok=True)
        opener = (lambda name: open(os.path.join(local, name), "wb")) if local else (  # noqa: E731
            lambda name: self.fs.open(L.join(info.staging, name), "wb"))
        with ThreadPoolExecutor(max_workers=max(1, len(groups)), thread_name_prefix="loomfs-ckpt-w") as pool:
            parts = list(pool.map(lambda ng: self._write_file(opener, ng[0], ng[1], planner, local is None),
                                  zip(names, groups, strict=True)))
        _fault("written")
        if local is not None:
            assert self.uploader is not None
            self.uploader.submit(rank_upload_job(self.fs, local, info, names, beat), key=info.final)
        return [r for part in parts for r in part]

    def _write_on_loop(self, info: PlanInfo, names: list[str], groups: list[list[WriteItem]],
                       planner: SavePlanner) -> list[WriteResult]:
        """Every file of the rank written concurrently by coroutines on the client's loop; the
        CRC32Cs are computed here meanwhile (crc32c releases the GIL)."""
        files = [(name, [_item_buffer(item, planner.resolve_data(item)) for item in items])
                 for name, items in zip(names, groups, strict=True)]
        client = self.fs.client
        paths = [L.join(info.staging, name) for name in names]
        job = asyncio.run_coroutine_threadsafe(
            write_files(client, [(p, [b for _i, b, _l in bufs]) for p, (_n, bufs) in zip(paths, files, strict=True)]),
            self.fs.loop)
        try:
            results = []
            for name, bufs in files:
                offset = 0
                for item, buf, loc in bufs:
                    loc = dataclasses.replace(loc, file=name, offset=offset, crc32c=crc(buf))
                    offset += loc.length
                    results.append(WriteResult(index=item.index, size_in_bytes=loc.length, storage_data=loc))
        except BaseException:
            job.cancel()
            raise
        job.result()
        return results

    def _write_file(self, opener: Callable[[str], Any], name: str, items: list[WriteItem],
                    planner: SavePlanner, sync: bool) -> list[WriteResult]:
        results = []
        offset = 0
        with opener(name) as f:
            for item in items:
                _item, buf, loc = _item_buffer(item, planner.resolve_data(item))
                loc = dataclasses.replace(loc, file=name, offset=offset, crc32c=crc(buf))
                f.write(buf)
                _fault("item")
                offset += len(buf)
                results.append(WriteResult(index=item.index, size_in_bytes=loc.length, storage_data=loc))
            if sync:
                f.flush()
                if hasattr(f, "fsync"):
                    f.fsync()
        return results

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        info = self.info
        assert info is not None
        storage: dict[MetadataIndex, ItemLoc] = {}
        for rank_results in results:
            storage.update({wr.index: wr.storage_data for wr in rank_results})
        metadata.storage_data = storage
        blobs = {L.METADATA_NAME: pickle.dumps(metadata), L.MANIFEST_NAME: manifest(self.step, info, storage)}
        need = files_needed(storage)
        if self.local_dir is not None:
            assert self.uploader is not None
            # alive while the commit waits in the queue and for the ranks' uploads
            beat = self.heartbeats.start(self.fs, L.join(info.staging, L.heartbeat_name(None)))
            try:
                self.uploader.submit(commit_job(self.fs, info, blobs, self.step is not None, self.commit_timeout_s,
                                                need, beat), key=info.final)
            except BaseException:
                beat.stop()
                raise
            return
        commit(self.fs, info, blobs, self.step is not None, need)
        self.checkpoint_path = info.final

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return False  # never picked automatically; pass it as storage_writer=

    # --- background uploads ----------------------------------------------------------------

    def wait(self, timeout_s: float | None = None) -> None:
        """Wait until this writer's background uploads are committed; raise their first error."""
        if self.uploader is not None:
            self.uploader.wait(timeout_s)


def manifest(step: int | None, info: PlanInfo, storage: dict[MetadataIndex, ItemLoc]) -> bytes:
    files: dict[str, list[list[int]]] = {}
    for loc in storage.values():
        files.setdefault(loc.file, []).append([loc.offset, loc.length, loc.crc32c])
    for items in files.values():
        items.sort()
    total = sum(x[1] for items in files.values() for x in items)
    doc = {"format": 1, "step": step, "name": os.path.basename(info.final), "created_utc": L.utc_stamp(),
           "world_size": info.world_size, "items": len(storage), "total_bytes": total, "files": files}
    return json.dumps(doc, sort_keys=True).encode()


def commit(fs: Any, info: PlanInfo, blobs: dict[str, bytes], move_latest: bool,
           need: dict[str, int] | None = None) -> None:
    """Check every data file is there (``need``: file -> bytes its items end at); metadata
    in, fsynced; rename staging -> final; move ``latest``; drop abandoned staging dirs."""
    check_files(fs, info.staging, need or {})
    done_markers = {done_marker(r) for r in range(info.world_size)}
    for name, data in blobs.items():
        with fs.open(L.join(info.staging, name), "wb") as f:
            f.write(data)
            f.fsync()
    for name in fs.listdir(info.staging):  # a tiered save's markers; heartbeats (every one stopped)
        if name.startswith(L.HEARTBEAT_PREFIX) or name in done_markers:
            fs.unlink(L.join(info.staging, name))
    _fault("metadata")
    try:
        fs.rename(info.staging, info.final, no_replace=True)
    except FileExistsError:  # a checkpoint of this name appeared meanwhile: ours goes
        L.remove_aside(fs, os.path.dirname(info.staging), os.path.basename(info.staging))
        raise
    _fault("renamed")
    run = os.path.dirname(info.final)
    step = L.parse_step(os.path.basename(info.final))
    if move_latest and step is not None:
        L.write_latest(fs, run, os.path.basename(info.final))
        _fault("latest")
        gc_staging(fs, run, step)
    logger.info("checkpoint %s committed", info.final)


def gc_staging(fs: Any, run: str, up_to_step: int, *, min_age_s: float = L.STAGING_AGE_S,
               now: float | None = None) -> list[str]:
    """Remove staging directories of steps <= ``up_to_step`` whose newest heartbeat is
    ``min_age_s`` old (abandoned by crashed saves; ``L.staging_idle_s``): a save still writing
    into one (an overlapping async save, a restarted job's predecessor, a tiered save waiting
    for its upload) rewrites its heartbeat every ``L.HEARTBEAT_S``, and is left alone. Each
    goes by ``remove_aside``."""
    now = time.time() if now is None else now
    removed = []
    for name in L.list_staging(fs, run):
        s = L.parse_staging_step(name)
        if s is None or s > up_to_step:
            continue
        try:
            if L.staging_idle_s(fs, L.join(run, name), now) < min_age_s:
                continue
        except FileNotFoundError:
            continue
        if L.remove_aside(fs, run, name):
            removed.append(name)
    return removed


def check_files(fs: Any, staging: str, need: dict[str, int]) -> None:
    """Every data file is in ``staging`` with at least the bytes its items need; else the
    save fails here, before ``.metadata`` makes it look complete."""
    for name, end in sorted(need.items()):
        try:
            size = fs.stat(L.join(staging, name)).st_size
        except FileNotFoundError:
            size = -1
        if size < end:
            state = "missing" if size < 0 else f"{size} bytes, items need {end}"
            raise OSError(errno.EIO, f"data file {name} is {state}: checkpoint not committed", staging)


def files_needed(storage: dict[MetadataIndex, ItemLoc]) -> dict[str, int]:
    need: dict[str, int] = {}
    for loc in storage.values():
        need[loc.file] = max(need.get(loc.file, 0), loc.offset + loc.length)
    return need
