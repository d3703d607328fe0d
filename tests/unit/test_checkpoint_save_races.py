"""Checkpoint saves and loads that overlap, without a cluster: a local directory stands in for
LoomFS (``LocalFS``, with ``rename(expect=...)`` as meta checks it). Each test failed on the
code before the fix it names."""

from __future__ import annotations

import errno
import io
import os
import shutil
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import LoadPlan, WriteItem, WriteItemType

from loomfs.checkpoint import LoomStorageReader, LoomStorageWriter, _writer, list_checkpoints
from loomfs.checkpoint import _layout as L
from loomfs.checkpoint._format import PlanInfo
from loomfs.checkpoint._writer import commit, gc_staging, plain_tensor


class _File(io.FileIO):
    def fsync(self) -> None:
        os.fsync(self.fileno())


class LocalFS:
    """The file-system calls the checkpoint code makes, on a local directory."""

    def __init__(self, root: Path, before_rename: Any = None):
        self.root = root
        self.before_rename = before_rename  # called with (src, dst) before each rename

    def _p(self, path: str) -> str:
        return str(self.root) + "/" + path.strip("/")

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        os.makedirs(self._p(path), exist_ok=exist_ok)

    def mkdir(self, path: str) -> None:
        os.mkdir(self._p(path))

    def exists(self, path: str) -> bool:
        return os.path.exists(self._p(path))

    def isdir(self, path: str) -> bool:
        return os.path.isdir(self._p(path))

    def listdir(self, path: str) -> list[str]:
        return sorted(os.listdir(self._p(path)))

    def stat(self, path: str) -> os.stat_result:
        return os.stat(self._p(path))

    def attr(self, path: str) -> SimpleNamespace:
        st = os.stat(self._p(path))
        return SimpleNamespace(inode=st.st_ino, size=st.st_size, mtime_ns=st.st_mtime_ns)

    def open(self, path: str, mode: str = "rb") -> _File:
        return _File(self._p(path), mode.replace("b", ""))

    def cat(self, path: str) -> bytes:
        with open(self._p(path), "rb") as f:
            return f.read()

    def unlink(self, path: str) -> None:
        os.unlink(self._p(path))

    def rmtree(self, path: str) -> None:
        shutil.rmtree(self._p(path))

    def rename(self, src: str, dst: str, *, no_replace: bool = False,
               expect: tuple[int, int, int] | None = None) -> None:
        if self.before_rename is not None:
            self.before_rename(src, dst)
        d = self._p(dst)
        if no_replace and os.path.exists(d):
            raise FileExistsError(errno.EEXIST, "exists", dst)
        if expect is not None:
            a = self.attr(dst)
            if (a.inode, a.size, a.mtime_ns) != expect:
                raise OSError(errno.EBUSY, "dst changed", dst)
        os.rename(self._p(src), d)


@pytest.fixture()
def fs(tmp_path: Path) -> LocalFS:
    return LocalFS(tmp_path)


def _age(fs: LocalFS, path: str, seconds: float) -> None:
    """Make a directory and its entries look untouched for ``seconds``."""
    old = time.time() - seconds
    for name in fs.listdir(path):
        os.utime(fs._p(L.join(path, name)), (old, old))
    os.utime(fs._p(path), (old, old))


# --- bug 2: a commit's gc removed other saves' staging directories -----------------------

def test_gc_leaves_a_save_in_progress_and_removes_an_abandoned_one(fs: LocalFS) -> None:
    fs.makedirs("/run")
    busy, dead = L.staging_name(L.step_name(1)), L.staging_name(L.step_name(1))
    for name in (busy, dead):
        fs.mkdir(f"/run/{name}")
        with fs.open(f"/run/{name}/__0_0.distcp", "wb") as f:
            f.write(b"x")
    _age(fs, f"/run/{dead}", 2 * L.STAGING_AGE_S)
    assert gc_staging(fs, "/run", 2) == [dead]
    assert fs.listdir("/run") == [busy]  # renamed aside, then deleted: no trash left


def test_commit_refuses_a_save_whose_data_files_went(fs: LocalFS) -> None:
    fs.makedirs("/run/.staging-x")
    with fs.open("/run/.staging-x/__0_0.distcp", "wb") as f:
        f.write(b"abc")
    info = PlanInfo(rank=0, world_size=1, staging="/run/.staging-x", final="/run/step-000001-20261202T101500Z")
    with pytest.raises(OSError, match="__1_0.distcp is missing"):
        commit(fs, info, {L.METADATA_NAME: b"m"}, True, {"__0_0.distcp": 3, "__1_0.distcp": 8})
    with pytest.raises(OSError, match="3 bytes, items need 4"):
        commit(fs, info, {L.METADATA_NAME: b"m"}, True, {"__0_0.distcp": 4})
    assert not fs.exists(info.final) and not fs.exists(L.join(info.staging, L.METADATA_NAME))


def test_overlapping_saves_both_commit(fs: LocalFS, monkeypatch: pytest.MonkeyPatch) -> None:
    """Save A (step 1) has written its data; save B (step 2) commits meanwhile: its gc used to
    remove A's staging directory, and A failed."""
    a_written, b_done = threading.Event(), threading.Event()

    def hook(where: str) -> None:
        if where == "written" and threading.current_thread().name == "saver-A":
            a_written.set()
            assert b_done.wait(30)

    monkeypatch.setattr(_writer, "fault_point", hook)
    errors: list[BaseException] = []

    def save_a() -> None:
        try:
            dcp.save({"w": torch.full((100,), 1.0)}, storage_writer=LoomStorageWriter("/run", fs, step=1), no_dist=True)
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=save_a, name="saver-A")
    t.start()
    assert a_written.wait(30)
    dcp.save({"w": torch.full((100,), 2.0)}, storage_writer=LoomStorageWriter("/run", fs, step=2), no_dist=True)
    b_done.set()
    t.join(30)
    assert not errors, errors
    cks = list_checkpoints(fs, "/run")
    assert [(c.step, c.complete) for c in cks] == [(1, True), (2, True)]
    got = {"w": torch.zeros(100)}
    dcp.load(got, storage_reader=LoomStorageReader(cks[0].path, fs), no_dist=True)
    assert torch.equal(got["w"], torch.full((100,), 1.0))
    assert L.read_latest(fs, "/run") == cks[1].name


# --- the hunter's suspicion: one writer, two overlapping saves ----------------------------

def test_one_writer_two_overlapping_saves(fs: LocalFS, monkeypatch: pytest.MonkeyPatch) -> None:
    """The second save's set_up/reset cleared the first's plan (self.info): its finish failed
    or committed the other save's staging directory."""
    w = LoomStorageWriter("/run", fs, step=1)
    a_written, b_done = threading.Event(), threading.Event()

    def hook(where: str) -> None:
        if where == "written" and threading.current_thread().name == "saver-A":
            a_written.set()
            assert b_done.wait(30)

    monkeypatch.setattr(_writer, "fault_point", hook)
    errors: list[BaseException] = []

    def save_a() -> None:
        try:
            dcp.save({"w": torch.full((10,), 1.0)}, storage_writer=w, no_dist=True)
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=save_a, name="saver-A")
    t.start()
    assert a_written.wait(30)
    w.step = 2
    dcp.save({"w": torch.full((10,), 2.0)}, storage_writer=w, no_dist=True)
    b_done.set()
    t.join(30)
    assert not errors, errors
    cks = list_checkpoints(fs, "/run")
    assert [(c.step, c.complete) for c in cks] == [(1, True), (2, True)]
    for c, value in zip(cks, (1.0, 2.0), strict=True):
        got = {"w": torch.zeros(10)}
        dcp.load(got, storage_reader=LoomStorageReader(c.path, fs), no_dist=True)
        assert torch.equal(got["w"], torch.full((10,), value)), c


def test_staged_copies_of_overlapping_async_saves_are_released_by_their_own_save(fs: LocalFS) -> None:
    w = LoomStorageWriter("/run", fs, step=1)
    a = w.stage({"w": torch.ones(8)})
    b = w.stage({"w": torch.ones(8)})  # a second save staged before the first wrote
    assert w.stager.reused_total == 0 and len(w._staged) == 2
    w.stager.release(w._claim_staged(SimpleNamespace(state_dict={"w": a["w"]})))  # save A wrote
    assert len(w._staged) == 1
    c = w.stage({"w": torch.ones(8)})  # reuses A's copy, not B's (still being written)
    assert c["w"].data_ptr() == a["w"].data_ptr() != b["w"].data_ptr()
    w.close()


# --- bug 3: ranks of one load resolved `latest` each on their own -------------------------

def test_every_rank_loads_what_the_coordinator_resolved(fs: LocalFS) -> None:
    dcp.save({"w": torch.full((4,), 1.0)}, storage_writer=LoomStorageWriter("/run", fs, step=1), no_dist=True)
    rank1 = LoomStorageReader("/run", fs)
    rank1.set_up_storage_reader(rank1.read_metadata(), False)  # resolves step 1
    dcp.save({"w": torch.full((4,), 2.0)}, storage_writer=LoomStorageWriter("/run", fs, step=2), no_dist=True)
    rank0 = LoomStorageReader("/run", fs)
    rank0.set_up_storage_reader(rank0.read_metadata(), True)  # the coordinator: step 2
    plans = rank0.prepare_global_plan([LoadPlan([]), LoadPlan([])])
    rank1._follow_coordinator(plans[1])
    assert rank1.checkpoint_path == rank0.checkpoint_path == list_checkpoints(fs, "/run")[1].path
    assert rank1.storage_data == rank0.storage_data


def test_a_rank_refuses_a_coordinator_checkpoint_of_another_structure(fs: LocalFS) -> None:
    dcp.save({"w": torch.ones(4)}, storage_writer=LoomStorageWriter("/run", fs, step=1), no_dist=True)
    rank1 = LoomStorageReader("/run", fs)
    rank1.set_up_storage_reader(rank1.read_metadata(), False)
    dcp.save({"w": torch.ones(5)}, storage_writer=LoomStorageWriter("/run", fs, step=2), no_dist=True)
    rank0 = LoomStorageReader("/run", fs)
    rank0.read_metadata()
    with pytest.raises(RuntimeError, match="structures differ"):
        rank1._follow_coordinator(rank0.prepare_global_plan([LoadPlan([])])[0])


# --- bug 4: ranks sharing one local_dir deleted each other's files -----------------------

def test_tiered_ranks_sharing_a_local_dir_keep_their_own_files(fs: LocalFS, tmp_path: Path) -> None:
    jobs: list[Any] = []
    up = SimpleNamespace(submit=lambda job, key: jobs.append(job))
    local = tmp_path / "nvme"
    fs.makedirs("/run/.staging-s")
    item = WriteItem(index=MetadataIndex("x"), type=WriteItemType.BYTE_IO)
    planner = SimpleNamespace(resolve_data=lambda i: io.BytesIO(b"payload"))
    for rank in (0, 1):
        w = LoomStorageWriter("/run", fs, step=1, local_dir=local, uploader=up)  # type: ignore[arg-type]
        info = PlanInfo(rank=rank, world_size=2, staging="/run/.staging-s", final="/run/step-000001-x")
        w._write_items(info, [[item]], planner)  # type: ignore[arg-type]
    jobs[0](SimpleNamespace(bytes_total=0, bytes_done=0))  # rank 0 uploads first
    jobs[1](SimpleNamespace(bytes_total=0, bytes_done=0))  # rank 1's files are still there
    assert fs.cat("/run/.staging-s/__0_0.distcp") == fs.cat("/run/.staging-s/__1_0.distcp") == b"payload"
    assert sorted(n for n in fs.listdir("/run/.staging-s") if n.endswith(".done")) == [".rank-0.done", ".rank-1.done"]
    assert not os.listdir(local)  # both uploaded: nothing left on the local disk


# --- bug 6: `latest` moved backwards -----------------------------------------------------

def test_latest_never_moves_back_when_a_newer_one_lands_during_the_move(tmp_path: Path) -> None:
    old, new = L.step_name(1, "20261202T101500Z"), L.step_name(2, "20261202T101500Z")
    raced: list[str] = []

    def race(src: str, dst: str) -> None:  # step 2's saver moves latest between step 1's look and rename
        if dst.endswith("/latest") and not raced:
            raced.append(src)
            fs.before_rename = None
            L.write_latest(fs, "/run", new)
            fs.before_rename = race

    fs = LocalFS(tmp_path)
    fs.makedirs("/run")
    L.write_latest(fs, "/run", L.step_name(0, "20261202T101500Z"))
    fs.before_rename = race
    assert not L.write_latest(fs, "/run", old)
    assert raced and L.read_latest(fs, "/run") == new
    assert [n for n in fs.listdir("/run") if n.startswith(".latest")] == []  # its temp file went


def test_the_first_latest_of_a_run_is_not_overwritten_by_an_older_one(tmp_path: Path) -> None:
    old, new = L.step_name(1, "20261202T101500Z"), L.step_name(2, "20261202T101500Z")
    once: list[int] = []

    def race(src: str, dst: str) -> None:
        if dst.endswith("/latest") and not once:
            once.append(1)
            fs.before_rename = None
            L.write_latest(fs, "/run", new)
            fs.before_rename = race

    fs = LocalFS(tmp_path, race)
    fs.makedirs("/run")
    assert not L.write_latest(fs, "/run", old)
    assert L.read_latest(fs, "/run") == new


# --- bug 7: inputs whose bytes are not their values; a plain save over an existing one -----

def test_conj_and_neg_views_are_saved_as_their_values() -> None:
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    assert torch.equal(plain_tensor(z.conj()), z.conj().resolve_conj())
    n = torch._neg_view(torch.tensor([1.0, -2.0]))
    assert torch.equal(plain_tensor(n), torch.tensor([-1.0, 2.0]))


def test_quantized_and_sparse_tensors_are_refused() -> None:
    q = torch.quantize_per_tensor(torch.ones(4), 0.5, 3, torch.qint8)
    with pytest.raises(ValueError, match="quantized"):
        plain_tensor(q)
    with pytest.raises(ValueError, match="sparse"):
        plain_tensor(torch.eye(3).to_sparse())


def test_a_second_plain_save_fails_before_writing(fs: LocalFS, monkeypatch: pytest.MonkeyPatch) -> None:
    dcp.save({"w": torch.ones(4)}, storage_writer=LoomStorageWriter("/ck", fs), no_dist=True)
    wrote: list[str] = []
    monkeypatch.setattr(_writer, "fault_point", wrote.append)
    with pytest.raises(BaseException) as raised:  # noqa: B017 (DCP wraps it: a CheckpointException)
        dcp.save({"w": torch.zeros(4)}, storage_writer=LoomStorageWriter("/ck", fs), no_dist=True)
    assert "FileExistsError" in repr(getattr(raised.value, "failures", raised.value))
    assert "item" not in wrote and fs.listdir("/") == ["ck"]
