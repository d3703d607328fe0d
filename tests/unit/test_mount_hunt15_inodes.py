"""The inode table follows names another client changed, as LOOKUPs find them (no I/O)."""

from __future__ import annotations

from loomfs.mount.inodes import InodeTable


def test_a_directory_found_under_a_new_name_takes_its_subtree_along() -> None:
    t = InodeTable()
    t.remember(2, "/d")
    t.remember(3, "/d/f")
    t.remember(4, "/d/sub")
    t.remember(5, "/d/sub/g")
    t.found(2, "/e", directory=True)  # another client renamed /d to /e
    assert [t.path(i) for i in (2, 3, 4, 5)] == ["/e", "/e/f", "/e/sub", "/e/sub/g"]
    assert t.inode_of("/d") is None and t.lookups(2) == 2


def test_a_file_found_by_another_name_asks_by_it_first() -> None:
    t = InodeTable()
    t.remember(7, "/x")
    t.remember(7, "/y")
    assert t.path(7) == "/x"
    t.found(7, "/y")  # /x was unlinked elsewhere; the kernel looked /y up
    assert t.path(7) == "/y" and t.lookups(7) == 3
    t.missing("/x")  # meta has nothing at /x
    assert t.inode_of("/x") is None and t.path(7) == "/y"


def test_drop_stale_keeps_the_last_name() -> None:
    t = InodeTable()
    t.remember(7, "/x")
    t.remember(7, "/y")
    assert t.drop_stale(7, "/x") and t.path(7) == "/y"
    assert not t.drop_stale(7, "/y") and t.path(7) == "/y"  # none other to try: kept
    assert not t.drop_stale(7, "/nowhere")


def test_a_directory_moved_under_its_old_name() -> None:
    t = InodeTable()
    t.remember(2, "/a")
    t.found(2, "/a/b", directory=True)  # mv /a /t; mkdir /a; mv /t /a/b elsewhere
    assert t.path(2) == "/a/b" and t.inode_of("/a") is None
