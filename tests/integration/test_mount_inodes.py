"""The mount's inode -> path table (no I/O, no mount needed)."""

from __future__ import annotations

import pytest

from loomfs.mount.inodes import ROOT_INODE, InodeTable
from loomfs.mount.options import MountOptions


def test_lookups_and_forget() -> None:
    t = InodeTable()
    t.remember(5, "/a")
    t.remember(5, "/a")
    assert t.path(5) == "/a" and t.lookups(5) == 2
    t.forget(5, 1)
    assert t.path(5) == "/a"
    t.forget(5, 1)
    with pytest.raises(FileNotFoundError):
        t.path(5)
    assert t.inode_of("/a") is None
    t.forget(ROOT_INODE, 10)
    assert t.path(ROOT_INODE) == "/"


def test_rename_moves_subtrees_and_replaces() -> None:
    t = InodeTable()
    t.remember(2, "/d")
    t.remember(3, "/d/x")
    t.remember(4, "/d/xy")
    t.remember(9, "/e")
    t.renamed("/d", "/e")
    assert (t.path(2), t.path(3), t.path(4)) == ("/e", "/e/x", "/e/xy")
    with pytest.raises(FileNotFoundError):
        t.path(9)  # replaced by the rename
    t.renamed("/e/x", "/e/xy", exchange=True)
    assert (t.path(3), t.path(4)) == ("/e/xy", "/e/x")
    assert repr(t) == "InodeTable(inodes=5, paths=4)"


def test_hard_links_keep_the_inode_named() -> None:
    t = InodeTable()
    t.remember(7, "/a")
    t.remember(7, "/b")
    t.unlinked("/a")
    assert t.path(7) == "/b"
    t.unlinked("/b")
    with pytest.raises(FileNotFoundError):
        t.path(7)


def test_options() -> None:
    o = MountOptions.parse(["attr_timeout=2,entry_timeout=0.5,allow_other", "loop=separate"])
    assert (o.attr_timeout_s, o.entry_timeout_s, o.loop) == (2.0, 0.5, "separate")
    assert o.fuse_options("loomfs:x") >= {"allow_other", "default_permissions", "fsname=loomfs:x"}
    assert "default_permissions" not in MountOptions.parse(["no_default_permissions"]).kernel
    with pytest.raises(ValueError):
        MountOptions.parse(["max_read=4194304"])
    with pytest.raises(ValueError):
        MountOptions.parse(["loop=trio"])
