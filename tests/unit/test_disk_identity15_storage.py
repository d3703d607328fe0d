"""A target directory's format id (storage.diskident): created once, atomically, kept across
restarts, new after a wipe; reported to mgmtd on registration and heartbeats."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from loomfs.config import StorageConfig
from loomfs.storage import diskident
from loomfs.storage.engine.memory import MemoryEngine
from loomfs.storage.server import open_targets
from loomfs.storage.target import StorageTarget


def test_created_once_and_kept(tmp_path: Path) -> None:
    d = tmp_path / "t0"
    fid, fresh = diskident.load_or_create(d)
    assert fresh and len(fid) == 32 and int(fid, 16) >= 0
    assert (d / diskident.FORMAT_ID_FILE).read_text().strip() == fid
    assert not (d / (diskident.FORMAT_ID_FILE + ".tmp")).exists()
    assert diskident.load_or_create(d) == (fid, False)  # a restart: the same disk


def test_a_wiped_directory_gets_a_new_id(tmp_path: Path) -> None:
    d = tmp_path / "t0"
    first, _ = diskident.load_or_create(d)
    shutil.rmtree(d)
    second, fresh = diskident.load_or_create(d)
    assert second != first and fresh


def test_a_directory_with_data_but_no_id_is_an_upgrade_not_a_new_disk(tmp_path: Path) -> None:
    d = tmp_path / "t0"
    d.mkdir()
    (d / "index.sqlite").write_bytes(b"x")
    fid, fresh = diskident.load_or_create(d)
    assert fid and not fresh


def test_a_malformed_id_is_refused_not_replaced(tmp_path: Path) -> None:
    """(review, session 15: it was replaced by a new id, and mgmtd then treated the good copy
    as a new disk and resynced over it)"""
    d = tmp_path / "t0"
    d.mkdir()
    (d / diskident.FORMAT_ID_FILE).write_text("not an id\n")
    (d / "index.sqlite").write_bytes(b"x")
    with pytest.raises(diskident.TargetDirError, match="malformed"):
        diskident.load_or_create(d)
    assert (d / diskident.FORMAT_ID_FILE).read_text() == "not an id\n"


def test_the_id_names_its_target_and_another_target_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "t0"
    fid, _ = diskident.load_or_create(d, 3001)
    assert (d / diskident.FORMAT_ID_FILE).read_text() == f"{fid}\ntarget 3001\n"
    assert diskident.load_or_create(d, 3001) == (fid, False)
    with pytest.raises(diskident.TargetDirError, match="belongs to target 3001"):
        diskident.load_or_create(d, 3002)  # the node's target order changed: not another disk
    old = tmp_path / "t1"  # a file of 5efb700 names no target: accepted for any
    old.mkdir()
    (old / diskident.FORMAT_ID_FILE).write_text("0123456789abcdef0123456789abcdef\n")
    assert diskident.load_or_create(old, 3002) == ("0123456789abcdef0123456789abcdef", False)


def test_swapped_or_shared_target_directories_are_refused(tmp_path: Path) -> None:
    cfg = StorageConfig(node_id=3, data_dir=str(tmp_path), targets=["a", "b"])
    for t in open_targets(cfg):
        t.engine.close()
    with pytest.raises(diskident.TargetDirError, match="belongs to target"):
        open_targets(StorageConfig(node_id=3, data_dir=str(tmp_path), targets=["b", "a"]))
    with pytest.raises(diskident.TargetDirError, match="share directory"):
        open_targets(StorageConfig(node_id=3, data_dir=str(tmp_path), targets=["a", str(tmp_path / "a")]))


def test_open_targets_reports_the_ids(tmp_path: Path) -> None:
    cfg = StorageConfig(node_id=3, data_dir=str(tmp_path), targets=["a", "b"])
    targets = open_targets(cfg)
    try:
        formats = diskident.target_formats(targets)
        assert [f.target_id for f in formats] == [3001, 3002]
        assert all(f.formatted_now for f in formats) and len({f.format_id for f in formats}) == 2
        assert formats[0].format_id == diskident.read_format_id(tmp_path / "a")
    finally:
        for t in targets:
            t.engine.close()
    again = open_targets(cfg)
    try:
        assert [(f.format_id, f.formatted_now) for f in diskident.target_formats(again)] == \
            [(f.format_id, False) for f in formats]
    finally:
        for t in again:
            t.engine.close()


def test_in_memory_targets_report_no_id() -> None:
    assert diskident.target_formats([StorageTarget(1001, MemoryEngine())]) == []
