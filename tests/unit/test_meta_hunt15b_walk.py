"""Hunt 15b: a symlink whose target ends in '/' demands a directory at the end of its whole
chain of links, even when a later link in that chain has no trailing slash (Linux: ENOTDIR)."""

from __future__ import annotations

import errno
import os

from test_meta_namespace import Env


def test_trailing_slash_survives_a_later_link_without_one() -> None:
    env = Env()
    env.create("/f")
    env.run(env.ns.symlink("l2/", "/l1"))  # l1 -> "l2/" -> l2 -> "f" (a file)
    env.run(env.ns.symlink("f", "/l2"))
    assert env.err(env.ns.stat("/l1")) == errno.ENOTDIR
    assert env.err(env.ns.open("/l1", os.O_RDONLY)) == errno.ENOTDIR
    assert env.err(env.ns.open("/l1", os.O_WRONLY)) == errno.ENOTDIR
    assert env.run(env.ns.stat("/l2")).type == 1  # without the slash: the file


def test_trailing_slash_chain_to_a_directory_resolves() -> None:
    env = Env()
    env.run(env.ns.mkdir("/d"))
    env.run(env.ns.symlink("m2/", "/m1"))
    env.run(env.ns.symlink("d", "/m2"))
    assert env.run(env.ns.stat("/m1")).type == 2
    env.run(env.ns.mkdir("/m1/x"))
    assert env.names("/d") == ["x"]
