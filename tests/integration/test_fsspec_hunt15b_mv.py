"""fsspec ``mv`` of a source ending with '/' (hunt 15b): as fsspec's copy-and-remove (and
this filesystem's ``cp``) do, the directory's contents move into the target, not the
directory itself."""

from __future__ import annotations

from test_fsspec import _close_shared_clients, lfs  # noqa: F401

from loomfs.fsspec import LoomFileSystem


def test_mv_trailing_slash_moves_the_contents_into_an_existing_dir(lfs: LoomFileSystem,  # noqa: F811
                                                                    base: str) -> None:
    lfs.pipe({f"{base}/a/x": b"1", f"{base}/a/s/y": b"2", f"{base}/b/old": b"0"})
    lfs.mv(f"{base}/a/", f"{base}/b/", recursive=True)
    assert lfs.find(f"{base}/b") == [f"{base}/b/old", f"{base}/b/s/y", f"{base}/b/x"]
    assert not lfs.exists(f"{base}/a")


def test_mv_trailing_slash_into_a_new_dir(lfs: LoomFileSystem, base: str) -> None:  # noqa: F811
    lfs.pipe({f"{base}/a/x": b"1", f"{base}/a/s/y": b"2"})
    lfs.mv(f"{base}/a/", f"{base}/c", recursive=True)
    assert lfs.find(f"{base}/c") == [f"{base}/c/s/y", f"{base}/c/x"]
    assert not lfs.exists(f"{base}/a")
    # and cp agrees (fsspec's own copy)
    lfs.cp(f"{base}/c/", f"{base}/d/", recursive=True)
    assert lfs.find(f"{base}/d") == [f"{base}/d/s/y", f"{base}/d/x"]


def test_mv_without_slash_still_moves_the_directory(lfs: LoomFileSystem, base: str) -> None:  # noqa: F811
    lfs.pipe({f"{base}/a/x": b"1", f"{base}/b/old": b"0"})
    lfs.mv(f"{base}/a", f"{base}/b", recursive=True)
    assert lfs.find(f"{base}/b") == [f"{base}/b/a/x", f"{base}/b/old"]
