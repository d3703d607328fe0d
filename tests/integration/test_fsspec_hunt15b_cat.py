"""fsspec ``cat(..., recursive=True)`` of a directory that holds no files (hunt 15b): the
answer is an empty dict (the directories the expansion listed are not files to read), not an
IndexError."""

from __future__ import annotations

from test_fsspec import _close_shared_clients, lfs  # noqa: F401

from loomfs.fsspec import LoomFileSystem


def test_cat_recursive_of_a_directory_without_files(lfs: LoomFileSystem, base: str) -> None:  # noqa: F811
    lfs.makedirs(f"{base}/empty")
    assert lfs.cat(f"{base}/empty", recursive=True) == {}
    lfs.makedirs(f"{base}/only_dirs/a/b")
    assert lfs.cat(f"{base}/only_dirs", recursive=True) == {}
    assert lfs.cat(f"{base}/only_dirs", recursive=True, start=0, end=1) == {}
    lfs.pipe(f"{base}/only_dirs/a/f", b"12")
    assert lfs.cat(f"{base}/only_dirs", recursive=True) == {f"{base}/only_dirs/a/f": b"12"}
    assert lfs.cat(f"{base}/only_dirs/a/f", recursive=True) == b"12"
