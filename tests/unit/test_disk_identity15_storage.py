"""A target directory's format id (storage.diskident): created once, atomically, kept across
restarts, new after a wipe; reported to mgmtd on registration and heartbeats."""

from __future__ import annotations

import shutil
from pathlib import Path

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


def test_a_malformed_id_is_replaced(tmp_path: Path) -> None:
    d = tmp_path / "t0"
    d.mkdir()
    (d / diskident.FORMAT_ID_FILE).write_text("not an id\n")
    (d / "index.sqlite").write_bytes(b"x")
    fid, fresh = diskident.load_or_create(d)
    assert len(fid) == 32 and fid != "not an id" and not fresh
    assert diskident.read_format_id(d) == fid


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
