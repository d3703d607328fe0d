"""Permission matrix: every operation, as root and as unprivileged users, on LoomFS's namespace
(through ``Namespace`` with the caller's ``Identity`` set, no sockets) and on a local directory
(a child process with setgroups/setresgid/setresuid, umask 0): the same errno, and for what an
operation creates or changes the same owner, group and mode bits (issue 13 item 6).

The local side needs root (to build a tree of other users' files and to become them): without
it the test is skipped, saying so. This file is also the local side's program
(``python test_perm_matrix.py --local``, JSON in on stdin, out on stdout).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import stat
import subprocess
import sys
import tempfile
from typing import Any

import pytest

# (kind, path, mode, uid, gid, symlink target); built by root, chown before chmod
TREE: list[tuple[str, str, int, int, int, str]] = [
    ("d", "pub", 0o777, 0, 0, ""),
    ("d", "pub/sticky", 0o1777, 0, 0, ""),
    ("f", "pub/sticky/fa", 0o644, 1000, 1000, ""),
    ("f", "pub/sticky/fb", 0o644, 1001, 1001, ""),
    ("d", "pub/sticky/da", 0o755, 1000, 1000, ""),
    ("d", "sticky_a", 0o1777, 1000, 1000, ""),  # a sticky directory A owns
    ("f", "sticky_a/fb", 0o644, 1001, 1001, ""),
    ("f", "pub/fa", 0o600, 1000, 1000, ""),
    ("d", "pub/da", 0o755, 1000, 1000, ""),
    ("d", "pub/dopen", 0o777, 0, 0, ""),
    ("d", "priv", 0o700, 0, 0, ""),
    ("f", "priv/f", 0o644, 0, 0, ""),
    ("d", "ro", 0o555, 0, 0, ""),
    ("f", "ro/f", 0o666, 0, 0, ""),
    ("d", "grp", 0o770, 0, 1000, ""),
    ("f", "grp/f", 0o660, 0, 1000, ""),
    ("d", "sgid", 0o2777, 0, 1000, ""),
    ("d", "noexec", 0o666, 0, 0, ""),
    ("f", "noexec/f", 0o644, 0, 0, ""),
    ("d", "xonly", 0o711, 0, 0, ""),
    ("f", "xonly/f", 0o644, 0, 0, ""),
    ("f", "f600", 0o600, 0, 0, ""),
    ("f", "f644", 0o644, 0, 0, ""),
    ("f", "f666", 0o666, 0, 0, ""),
    ("f", "fa", 0o644, 1000, 1000, ""),
    ("f", "fa_g", 0o644, 1000, 1001, ""),
    ("f", "fa_suid", 0o6755, 1000, 1000, ""),
    ("f", "fa_sgid_nx", 0o2644, 1000, 1000, ""),
    ("l", "pub/lnk", 0o777, 0, 0, "../f600"),
]

# (uid, gid, supplementary groups)
USERS: dict[str, tuple[int, int, tuple[int, ...]]] = {
    "root": (0, 0, ()),
    "a": (1000, 1000, ()),
    "b_in_a_group": (1001, 1001, (1000,)),
    "nobody": (65534, 65534, ()),
}

# (op, args); the op's result (besides the errno) is the (uid, gid, mode) of "show" afterwards
OPS: list[tuple[str, list[Any]]] = [
    ("stat", ["priv/f"]), ("stat", ["xonly/f"]), ("stat", ["noexec/f"]), ("stat", ["f600"]),
    ("stat", ["pub/lnk"]), ("stat", ["priv/missing"]), ("stat", ["pub/missing/x"]),
    ("listdir", ["priv"]), ("listdir", ["xonly"]), ("listdir", ["noexec"]), ("listdir", ["ro"]),
    ("listdir", ["grp"]),
    ("open_r", ["f600"]), ("open_r", ["f644"]), ("open_r", ["grp/f"]), ("open_r", ["xonly/f"]),
    ("open_r", ["priv/f"]), ("open_r", ["pub/lnk"]), ("open_r", ["priv"]), ("open_r", ["noexec"]),
    ("open_w", ["f644"]), ("open_w", ["f666"]), ("open_w", ["grp/f"]), ("open_w", ["ro/f"]),
    ("open_w", ["fa"]), ("open_rw", ["f644"]), ("open_rw", ["f666"]), ("open_trunc", ["f644"]),
    ("open_trunc", ["f666"]), ("open_w", ["priv"]),
    ("creat", ["pub/new", 0o644]), ("creat", ["ro/new", 0o644]), ("creat", ["priv/new", 0o644]),
    ("creat", ["grp/new", 0o644]), ("creat", ["sgid/new", 0o2755]), ("creat", ["noexec/new", 0o644]),
    ("creat", ["xonly/new", 0o644]), ("creat", ["pub/new", 0o4755]), ("creat", ["f644", 0o644]),
    ("open_creat", ["f666", 0o644]), ("open_creat", ["ro/f", 0o644]), ("open_creat", ["ro/new", 0o644]),
    ("mkdir", ["pub/nd", 0o755]), ("mkdir", ["sgid/nd", 0o755]), ("mkdir", ["ro/nd", 0o755]),
    ("mkdir", ["ro/f", 0o755]), ("mkdir", ["priv/nd", 0o755]), ("mkdir", ["grp/nd", 0o700]),
    ("unlink", ["f644"]), ("unlink", ["pub/fa"]), ("unlink", ["pub/sticky/fa"]), ("unlink", ["pub/sticky/fb"]),
    ("unlink", ["sticky_a/fb"]), ("unlink", ["ro/f"]), ("unlink", ["grp/f"]), ("unlink", ["pub/missing"]),
    ("unlink", ["ro/missing"]), ("unlink", ["pub/da"]),
    ("rmdir", ["pub/da"]), ("rmdir", ["pub/sticky/da"]), ("rmdir", ["priv"]), ("rmdir", ["pub/dopen"]),
    ("rmdir", ["ro/missing"]),
    ("rename", ["pub/fa", "pub/fa2"]), ("rename", ["pub/sticky/fa", "pub/sticky/x"]),
    ("rename", ["pub/sticky/fb", "pub/x"]), ("rename", ["pub/da", "ro/da"]),
    ("rename", ["pub/da", "pub/sticky/da2"]), ("rename", ["pub/dopen", "pub/sticky/d2"]),
    ("rename", ["f644", "pub/x"]), ("rename", ["pub/fa", "pub/sticky/fb"]),
    ("rename", ["pub/fa", "ro/f"]), ("rename", ["pub/missing", "pub/y"]),
    ("link", ["f644", "pub/l"]), ("link", ["f666", "pub/l"]), ("link", ["fa", "pub/l"]),
    ("link", ["fa_suid", "pub/l"]), ("link", ["f666", "ro/l"]), ("link", ["f666", "f644"]),
    ("symlink", ["x", "pub/s"]), ("symlink", ["x", "ro/s"]), ("symlink", ["x", "sgid/s"]),
    ("mkfifo", ["pub/p", 0o640]), ("mkfifo", ["ro/p", 0o640]), ("mkfifo", ["sgid/p", 0o640]),
    ("chmod", ["fa", 0o600]), ("chmod", ["f644", 0o600]), ("chmod", ["fa_g", 0o2755]),
    ("chmod", ["fa", 0o2755]), ("chmod", ["pub/sticky", 0o777]),
    ("chown", ["fa", 1001, -1]), ("chown", ["fa", -1, 1000]), ("chown", ["fa_g", -1, 1000]),
    ("chown", ["fa", -1, 1001]), ("chown", ["fa_suid", -1, 1000]), ("chown", ["fa_sgid_nx", -1, 1000]),
    ("chown", ["f644", 0, -1]), ("chown", ["f644", -1, 1000]), ("chown", ["fa", 1000, -1]),
    ("truncate", ["f644", 0]), ("truncate", ["f666", 0]), ("truncate", ["fa", 0]),
    ("truncate", ["priv/f", 0]), ("truncate", ["pub", 0]),
    ("utime", ["f666"]), ("utime", ["fa"]), ("utime", ["f644"]),
    ("utime_now", ["f666"]), ("utime_now", ["f644"]), ("utime_now", ["fa"]),
    ("readlink", ["pub/lnk"]), ("readlink", ["priv/missing"]),
]

# the path whose (uid, gid, mode) an op reports afterwards (its second path, else its first)
SHOW = {"creat": 0, "open_creat": 0, "mkdir": 0, "symlink": 1, "mkfifo": 0, "chmod": 0, "chown": 0,
        "link": 1, "rename": 1}


# -- the local side (a separate process, as root; one child per operation) ----------------------


def _build_local(root: str) -> None:
    for kind, path, mode, uid, gid, target in TREE:
        p = os.path.join(root, path)
        if kind == "d":
            os.mkdir(p)
        elif kind == "f":
            os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o600))
        else:
            os.symlink(target, p)
        os.lchown(p, uid, gid)
        if kind != "l":
            os.chmod(p, mode)


def _local_op(root: str, op: str, args: list[Any]) -> None:
    def p(i: int) -> str:
        return os.path.join(root, args[i])

    if op == "stat":
        os.stat(p(0))
    elif op == "listdir":
        os.listdir(p(0))
    elif op in ("open_r", "open_w", "open_rw", "open_trunc"):
        flags = {"open_r": os.O_RDONLY, "open_w": os.O_WRONLY, "open_rw": os.O_RDWR,
                 "open_trunc": os.O_WRONLY | os.O_TRUNC}[op]
        os.close(os.open(p(0), flags))
    elif op == "creat":
        os.close(os.open(p(0), os.O_CREAT | os.O_WRONLY | os.O_EXCL, args[1]))
    elif op == "open_creat":
        os.close(os.open(p(0), os.O_CREAT | os.O_WRONLY, args[1]))
    elif op == "mkdir":
        os.mkdir(p(0), args[1])
    elif op == "unlink":
        os.unlink(p(0))
    elif op == "rmdir":
        os.rmdir(p(0))
    elif op == "rename":
        os.rename(p(0), p(1))
    elif op == "link":
        os.link(p(0), p(1), follow_symlinks=False)
    elif op == "symlink":
        os.symlink(args[0], p(1))
    elif op == "mkfifo":
        os.mkfifo(p(0), args[1])
    elif op == "chmod":
        os.chmod(p(0), args[1])
    elif op == "chown":
        os.chown(p(0), args[1], args[2])
    elif op == "truncate":
        os.truncate(p(0), args[1])
    elif op == "utime":
        os.utime(p(0), ns=(1, 1))
    elif op == "utime_now":
        os.utime(p(0), None)
    elif op == "readlink":
        os.readlink(p(0))
    else:
        raise AssertionError(op)


def _shown(root: str, op: str, args: list[Any]) -> list[int] | None:
    i = SHOW.get(op)
    if i is None:
        return None
    try:
        st = os.lstat(os.path.join(root, args[i]))
    except OSError:
        return None
    return [st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)]


def local_matrix(cases: list[tuple[str, str, list[Any]]]) -> list[tuple[int, list[int] | None]]:
    """Each (user, op, args) on a fresh tree under a new directory in /tmp (searchable by all)."""
    out: list[tuple[int, list[int] | None]] = []
    for user, op, args in cases:
        base = tempfile.mkdtemp(prefix="loomfs-perm-", dir="/tmp")
        try:
            root = os.path.join(base, "t")
            os.mkdir(root)
            os.chmod(base, 0o755)
            os.chmod(root, 0o755)
            _build_local(root)
            uid, gid, groups = USERS[user]
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: become the user, do the op, report the errno
                code = 0
                try:
                    os.close(r)
                    os.setgroups(list(groups))
                    os.setresgid(gid, gid, gid)
                    os.setresuid(uid, uid, uid)
                    os.umask(0)
                    _local_op(root, op, args)
                except OSError as exc:
                    code = exc.errno or -1
                except BaseException:  # noqa: BLE001 - anything else is a bug: report it as -2
                    code = -2
                os.write(w, str(code).encode())
                os._exit(0)
            os.close(w)
            got = b""
            while chunk := os.read(r, 64):
                got += chunk
            os.close(r)
            os.waitpid(pid, 0)
            out.append((int(got), _shown(root, op, args)))
        finally:
            shutil.rmtree(base, ignore_errors=True)
    return out


# -- the LoomFS side -----------------------------------------------------------------------------


class _OneChain:
    """Routing with one chain table of one chain (files need a layout; no storage is touched)."""

    def __init__(self) -> None:
        from loomfs.common.routing import Routing
        from loomfs.wire.types import ChainInfo, ChainTable, RoutingInfo

        self.routing = Routing(RoutingInfo(version=1, chains=[ChainInfo(chain_id=101, targets=[1], table_id=1)],
                                           tables=[ChainTable(table_id=1, replicas=1, chain_ids=[101])]))

    async def get(self) -> Any:
        return self.routing

    async def refresh(self, min_version: int = 0) -> Any:
        return self.routing


async def _loom_case(user: str, op: str, args: list[Any]) -> tuple[int, list[int] | None]:
    from loomfs.common.identity import Identity
    from loomfs.meta.caller import acting_as
    from loomfs.meta.ops.namespace import Namespace
    from loomfs.meta.store.sqlite import SqliteStore
    from loomfs.wire.types import FileType, Layout

    store = SqliteStore(":memory:")
    ns = Namespace(store, routing=_OneChain(), rng=random.Random(1),
                   default_layout=Layout(inline_max_bytes=4096, table_id=1))
    try:
        await ns.init()
        for kind, path, mode, uid, gid, target in TREE:
            p = "/" + path
            if kind == "d":
                await ns.mkdir(p, mode=0o700)
            elif kind == "f":
                await ns.open(p, os.O_CREAT | os.O_WRONLY | os.O_EXCL, mode=0o600, data=b"")
            else:
                await ns.symlink(target, p)
            await ns.setattr(p, follow_symlinks=False, uid=uid, gid=gid)
            if kind != "l":
                await ns.setattr(p, mode=mode)
        uid, gid, groups = USERS[user]
        code = 0
        with acting_as(Identity(uid=uid, gid=gid, groups=groups)):
            try:
                await _loom_op(ns, op, args, FileType)
            except OSError as exc:
                code = exc.errno or -1
        shown: list[int] | None = None
        i = SHOW.get(op)
        if i is not None:
            try:
                a = await ns.stat("/" + args[i], follow_symlinks=False)
                shown = [a.uid, a.gid, a.mode & 0o7777]
            except OSError:
                shown = None
        return code, shown
    finally:
        await store.close()


async def _loom_op(ns: Any, op: str, args: list[Any], file_type: Any) -> None:
    def p(i: int) -> str:
        return "/" + args[i]

    async def opened(path: str, flags: int, **kw: Any) -> None:
        o = await ns.open(path, flags, **kw)
        if o.session_id:
            await ns.close(o.attr.inode, o.session_id)

    if op == "stat":
        await ns.stat(p(0))
    elif op == "listdir":
        await ns.readdir(p(0))
    elif op in ("open_r", "open_w", "open_rw", "open_trunc"):
        flags = {"open_r": os.O_RDONLY, "open_w": os.O_WRONLY, "open_rw": os.O_RDWR,
                 "open_trunc": os.O_WRONLY | os.O_TRUNC}[op]
        await opened(p(0), flags)
    elif op == "creat":
        await opened(p(0), os.O_CREAT | os.O_WRONLY | os.O_EXCL, mode=args[1])
    elif op == "open_creat":
        await opened(p(0), os.O_CREAT | os.O_WRONLY, mode=args[1])
    elif op == "mkdir":
        await ns.mkdir(p(0), mode=args[1])
    elif op == "unlink":
        await ns.unlink(p(0))
    elif op == "rmdir":
        await ns.rmdir(p(0))
    elif op == "rename":
        await ns.rename(p(0), p(1))
    elif op == "link":
        await ns.link(p(0), p(1))
    elif op == "symlink":
        await ns.symlink(args[0], p(1))
    elif op == "mkfifo":
        await ns.mknod(p(0), type=int(file_type.FIFO), mode=args[1])
    elif op == "chmod":
        await ns.setattr(p(0), mode=args[1])
    elif op == "chown":
        await ns.setattr(p(0), uid=args[1], gid=args[2])
    elif op == "truncate":
        await ns.setattr(p(0), size=args[1])
    elif op == "utime":
        await ns.setattr(p(0), atime_ns=1, mtime_ns=1)
    elif op == "utime_now":
        await ns.setattr(p(0), times_now=True)
    elif op == "readlink":
        await ns.readlink(p(0))
    else:
        raise AssertionError(op)


def _cases() -> list[tuple[str, str, list[Any]]]:
    return [(user, op, args) for op, args in OPS for user in USERS]


@pytest.fixture(scope="module")
def local() -> list[tuple[int, list[int] | None]]:
    if os.geteuid() != 0:
        pytest.skip("the local side needs root (build other users' files, setresuid)")
    proc = subprocess.run([sys.executable, __file__, "--local"], input=json.dumps(_cases()), capture_output=True,
                          text=True, timeout=120, check=True)
    return [(code, shown) for code, shown in json.loads(proc.stdout)]


def test_matrix_matches_local_directory(local: list[tuple[int, list[int] | None]]) -> None:
    cases = _cases()
    loop = asyncio.new_event_loop()
    try:
        loom = [loop.run_until_complete(_loom_case(user, op, args)) for user, op, args in cases]
    finally:
        loop.close()
    assert -2 not in [code for code, _ in local], "the local side failed with a non-OSError"
    diffs = []
    for (user, op, args), (lcode, lshown), (mcode, mshown) in zip(cases, local, loom, strict=True):
        if lcode != mcode or lshown != mshown:
            diffs.append(f"{op}{tuple(args)} as {user}: local {_fmt(lcode, lshown)}, LoomFS {_fmt(mcode, mshown)}")
    assert not diffs, f"{len(diffs)} of {len(cases)} differ:\n" + "\n".join(diffs)
    # the matrix is not trivial: both refusals and successes, for the unprivileged users too
    codes = {code for code, _ in local}
    assert {0, 1, 13} <= codes


def _fmt(code: int, shown: list[int] | None) -> str:
    import errno

    name = "ok" if code == 0 else errno.errorcode.get(code, str(code))
    return name if shown is None else f"{name} {shown[0]}:{shown[1]} {shown[2]:o}"


if __name__ == "__main__" and sys.argv[1:] == ["--local"]:
    print(json.dumps(local_matrix(json.load(sys.stdin))))
