"""Hunt 15b: the namespace's POSIX edge cases that held (kept as regression tests): rename's
errors and no-ops, directory link counts across parents, parents' and inodes' times, and the
statfs counters through rename-over, links, orphans and failed operations."""

from __future__ import annotations

import errno
import os

from test_meta_namespace import CREAT, Env


def _counts(env: Env) -> tuple[int, int, int]:
    s = env.run(env.ns.statfs())
    return s.files, s.directories, s.bytes_used


def _times(env: Env, path: str) -> tuple[int, int]:
    a = env.run(env.ns.stat(path, follow_symlinks=False))
    return a.mtime_ns, a.ctime_ns


def _nlink(env: Env, path: str) -> int:
    return env.run(env.ns.stat(path)).nlink


def _sized(env: Env, path: str, size: int) -> None:
    o = env.run(env.ns.open(path, CREAT))
    env.run(env.ns.close(o.attr.inode, o.session_id, length=size))


def test_directory_link_counts_across_parents() -> None:
    env = Env()
    for p in ("/a", "/b", "/a/x"):
        env.run(env.ns.mkdir(p))
    assert _nlink(env, "/a") == 3
    env.run(env.ns.rename("/a/x", "/b/x"))
    assert (_nlink(env, "/a"), _nlink(env, "/b")) == (2, 3)
    env.run(env.ns.mkdir("/a/y"))
    env.run(env.ns.rename("/b/x", "/a/y"))  # over an empty directory, in another parent
    assert (_nlink(env, "/a"), _nlink(env, "/b"), _nlink(env, "/")) == (3, 2, 4)
    env.create("/b/f")
    env.run(env.ns.exchange("/a/y", "/b/f"))
    assert (_nlink(env, "/a"), _nlink(env, "/b")) == (2, 3)
    env.run(env.ns.rmdir("/b/f"))
    assert _nlink(env, "/b") == 2
    assert _counts(env) == (1, 3, 0)


def test_rename_no_ops_and_errors_change_nothing() -> None:
    env = Env()
    env.create("/f")
    env.run(env.ns.link("/f", "/g"))
    env.run(env.ns.mkdir("/d"))
    env.run(env.ns.mkdir("/d/e"))
    env.create("/d/e/h")
    env.run(env.ns.mkdir("/empty"))
    env.clock.advance(1)
    before, root = _counts(env), _times(env, "/")
    env.run(env.ns.rename("/f", "/g"))  # a hard link of itself
    env.run(env.ns.rename("/f", "/f"))
    env.run(env.ns.rename("/d", "/d"))
    assert env.names("/") == ["d", "empty", "f", "g"]
    assert _times(env, "/") == root and _nlink(env, "/f") == 2
    assert env.err(env.ns.rename("/d", "/d/e/z")) == errno.EINVAL
    assert env.err(env.ns.rename("/d", "/d/e")) == errno.EINVAL
    assert env.err(env.ns.rename("/empty", "/d")) == errno.ENOTEMPTY
    assert env.err(env.ns.rename("/d/e/h", "/d")) == errno.ENOTEMPTY
    assert env.err(env.ns.rename("/f", "/empty")) == errno.EISDIR
    assert env.err(env.ns.rename("/empty", "/f")) == errno.ENOTDIR
    assert env.err(env.ns.rename("/f", "/g", no_replace=True)) == errno.EEXIST
    assert env.err(env.ns.rename("/nope", "/x")) == errno.ENOENT
    assert env.err(env.ns.exchange("/d", "/d/e/h")) == errno.EINVAL
    env.run(env.ns.symlink("/d/e", "/l"))
    assert env.err(env.ns.rename("/d", "/l/z")) == errno.EINVAL  # into its subtree through a link
    assert _counts(env) == before


def test_times_of_parents_and_inodes() -> None:
    env = Env()
    env.run(env.ns.mkdir("/a"))
    env.run(env.ns.mkdir("/b"))
    env.create("/a/f")
    env.create("/b/g")
    env.run(env.ns.link("/b/g", "/b/g2"))
    env.clock.advance(1)
    now = env.clock.now_ns()
    env.run(env.ns.rename("/a/f", "/b/g"))  # over one name of a file with two
    assert _times(env, "/a") == (now, now) and _times(env, "/b") == (now, now)
    assert _times(env, "/b/g")[1] == now and _times(env, "/b/g2")[1] == now
    env.clock.advance(1)
    now = env.clock.now_ns()
    env.run(env.ns.link("/b/g2", "/a/h"))
    assert _times(env, "/a") == (now, now) and _times(env, "/a/h")[1] == now
    env.clock.advance(1)
    now = env.clock.now_ns()
    env.run(env.ns.unlink("/a/h"))
    assert _times(env, "/a") == (now, now) and _times(env, "/b/g2")[1] == now
    for change in (lambda: env.ns.setattr("/b/g2", mode=0o600), lambda: env.ns.setxattr("/b/g2", b"user.x", b"1"),
                   lambda: env.ns.removexattr("/b/g2", b"user.x")):
        env.clock.advance(1)
        now = env.clock.now_ns()
        env.run(change())
        assert _times(env, "/b/g2")[1] == now
    env.clock.advance(1)
    now = env.clock.now_ns()
    env.run(env.ns.exchange("/a", "/b/g2"))
    assert _times(env, "/") == (now, now) and _times(env, "/b") == (now, now)
    assert _times(env, "/a")[1] == now and _times(env, "/b/g2")[1] == now


def test_counters_through_rename_over_links_and_orphans() -> None:
    env = Env()
    _sized(env, "/f", 100)
    _sized(env, "/g", 50)
    held = env.run(env.ns.open("/g", os.O_WRONLY))
    assert _counts(env) == (2, 1, 150)
    env.run(env.ns.rename("/f", "/g"))  # /g's old file lives on, nameless, while open
    assert _counts(env) == (2, 1, 150)
    env.run(env.ns.close(held.attr.inode, held.session_id))
    assert _counts(env) == (1, 1, 100)
    env.run(env.ns.link("/g", "/h"))
    env.run(env.ns.unlink("/g"))
    assert _counts(env) == (1, 1, 100)
    assert env.err(env.ns.open("/h", CREAT | os.O_EXCL)) == errno.EEXIST
    assert env.err(env.ns.open("/h/x", CREAT)) == errno.ENOTDIR
    assert env.err(env.ns.mkdir("/h/x", parents=True)) == errno.ENOTDIR
    assert _counts(env) == (1, 1, 100)
    env.run(env.ns.unlink("/h"))
    assert _counts(env) == (0, 1, 0)


def test_symlink_loops_and_name_lengths() -> None:
    env = Env()
    env.run(env.ns.symlink("/l2", "/l1"))
    env.run(env.ns.symlink("/l1", "/l2"))
    assert env.err(env.ns.stat("/l1")) == errno.ELOOP
    assert env.err(env.ns.open("/l1/x", CREAT)) == errno.ELOOP
    env.run(env.ns.mkdir("/d"))
    env.run(env.ns.symlink("/d", "/s0"))
    for i in range(1, 41):
        env.run(env.ns.symlink(f"/s{i - 1}", f"/s{i}"))
    assert env.run(env.ns.stat("/s39")).type == 2  # 40 links followed
    assert env.err(env.ns.stat("/s40")) == errno.ELOOP
    assert env.err(env.ns.mkdir("/" + "é" * 128)) == errno.ENAMETOOLONG  # 256 bytes, 128 characters
    env.run(env.ns.mkdir("/" + "é" * 127 + "a"))  # 255 bytes
