"""Review of the disk-identity change (5efb700): gaps in storage.diskident. Each test is a
real problem, marked xfail(strict=True) until it is fixed."""

from __future__ import annotations

from pathlib import Path

import pytest

from loomfs.storage import diskident


@pytest.mark.xfail(strict=True, reason="review15: an unreadable or malformed id file in a directory full of data is "
                                       "overwritten with a new random id: mgmtd then marks a healthy copy blank (for "
                                       "good: the old id is destroyed); it should refuse to open the target instead")
def test_a_malformed_id_in_a_populated_directory_is_not_replaced(tmp_path: Path) -> None:
    d = tmp_path / "t0"
    d.mkdir()
    (d / "index.sqlite").write_bytes(b"x")  # the target holds data
    (d / "chunks").mkdir()
    bad = "0123456789abcdef0123456789abcdeZ\n"  # one rotten character
    (d / diskident.FORMAT_ID_FILE).write_text(bad)
    try:
        diskident.load_or_create(d)
    except Exception:
        pass  # refusing to open the target is fine
    assert (d / diskident.FORMAT_ID_FILE).read_text() == bad


@pytest.mark.xfail(strict=True, reason="review15: a freshly made ext4/xfs file system mounted as the target holds "
                                       "lost+found, so a new disk is reported as not formatted_now (an upgrade): "
                                       "with no id recorded mgmtd accepts the empty disk as holding the chain's data")
def test_a_new_file_system_with_lost_and_found_is_a_new_disk(tmp_path: Path) -> None:
    d = tmp_path / "mnt"
    d.mkdir()
    (d / "lost+found").mkdir()
    _, fresh = diskident.load_or_create(d)
    assert fresh
