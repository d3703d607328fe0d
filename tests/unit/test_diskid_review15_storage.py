"""Review of the disk-identity change (5efb700): gaps in storage.diskident, fixed (session 15):
an unreadable or malformed id is refused, not replaced; a new file system's lost+found is no data."""

from __future__ import annotations

from pathlib import Path

import pytest

from loomfs.storage import diskident


def test_a_malformed_id_in_a_populated_directory_is_not_replaced(tmp_path: Path) -> None:
    d = tmp_path / "t0"
    d.mkdir()
    (d / "index.sqlite").write_bytes(b"x")  # the target holds data
    (d / "chunks").mkdir()
    bad = "0123456789abcdef0123456789abcdeZ\n"  # one rotten character
    (d / diskident.FORMAT_ID_FILE).write_text(bad)
    with pytest.raises(diskident.TargetDirError):
        diskident.load_or_create(d)  # refused: an operator decides
    assert (d / diskident.FORMAT_ID_FILE).read_text() == bad


def test_a_new_file_system_with_lost_and_found_is_a_new_disk(tmp_path: Path) -> None:
    d = tmp_path / "mnt"
    d.mkdir()
    (d / "lost+found").mkdir()
    _, fresh = diskident.load_or_create(d)
    assert fresh
