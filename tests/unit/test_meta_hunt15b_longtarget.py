"""Hunt 15b: a name longer than 255 bytes of UTF-8 met in a symlink's target is ENAMETOOLONG
(as Linux answers), and never becomes a directory entry (an O_CREAT or mkdir through a
dangling link used to create it)."""

from __future__ import annotations

import errno
import os

from test_meta_namespace import CREAT, Env

LONG = "é" * 128  # 128 characters, 256 bytes
OK = "é" * 127 + "a"  # 255 bytes


def test_create_through_a_link_to_a_too_long_name() -> None:
    env = Env()
    env.run(env.ns.symlink(LONG, "/l"))  # allowed: a target is a string
    env.run(env.ns.mkdir("/d"))
    env.run(env.ns.symlink(f"/d/{LONG}/x", "/m"))
    before = env.run(env.ns.statfs())
    assert env.err(env.ns.stat("/l")) == errno.ENAMETOOLONG
    assert env.err(env.ns.open("/l", CREAT)) == errno.ENAMETOOLONG
    assert env.err(env.ns.open("/l", os.O_RDONLY)) == errno.ENAMETOOLONG
    assert env.err(env.ns.stat("/m")) == errno.ENAMETOOLONG
    assert env.err(env.ns.mkdir("/l/x", parents=True)) == errno.ENAMETOOLONG
    assert env.names("/") == ["d", "l", "m"]
    assert env.names("/d") == []
    assert env.run(env.ns.statfs()) == before


def test_a_255_byte_name_in_a_target_still_resolves() -> None:
    env = Env()
    env.run(env.ns.symlink(OK, "/l"))
    o = env.create("/l")
    assert o.created
    assert env.run(env.ns.stat("/l")).inode == env.run(env.ns.stat("/" + OK)).inode
