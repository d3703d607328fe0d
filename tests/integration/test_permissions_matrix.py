"""The permission matrix end to end: path operations through the blocking client API with tokens
for other users (authentication on), compared with a local directory as the same users (same
errno; same owner, group and mode of what is created or changed). The tree, the users and the
local side are tests/unit/test_perm_matrix.py's; here a subset of its operations (the namespace
ones the client API maps one to one) for the unprivileged user with a supplementary group."""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import loomfs
from loomfs.config import ClientConfig, RpcConfig
from loomfs.net.credentials import create_token, load_secret_file, rights_for, write_token_file
from loomfs.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

_UNIT = Path(__file__).resolve().parent.parent / "unit" / "test_perm_matrix.py"
_spec = importlib.util.spec_from_file_location("perm_matrix_tables", _UNIT)
assert _spec is not None and _spec.loader is not None
M = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(M)

OPS = {"stat", "listdir", "mkdir", "unlink", "rmdir", "rename", "link", "symlink", "chmod", "chown", "truncate",
       "utime", "utime_now", "readlink"}
USERS = ("b_in_a_group",)  # uid, gid and a supplementary group, all from the token (nobody: unit level)


def _cases() -> list[tuple[str, str, list[Any]]]:
    return [(user, op, args) for op, args in M.OPS if op in OPS for user in USERS]


def _build(fs: loomfs.LoomFS, root: str) -> None:
    fs.mkdir(root, mode=0o755)
    for kind, path, mode, uid, gid, target in M.TREE:
        p = f"{root}/{path}"
        if kind == "d":
            fs.mkdir(p, mode=0o700)
        elif kind == "f":
            with fs.open(p, "wb"):
                pass
        else:
            fs.symlink(target, p)
        fs.chown(p, uid, gid) if kind != "l" else fs.run(fs.client._setattr(_lchown(p, uid, gid)))
        if kind != "l":
            fs.chmod(p, mode)


def _lchown(path: str, uid: int, gid: int) -> Any:
    from loomfs.wire.meta import SetattrReq

    return SetattrReq(path=path, follow_symlinks=False, uid=uid, gid=gid)


def _op(fs: loomfs.LoomFS, root: str, op: str, args: list[Any]) -> None:
    def p(i: int) -> str:
        return f"{root}/{args[i]}"

    if op == "stat":
        fs.stat(p(0))
    elif op == "listdir":
        fs.listdir(p(0))
    elif op == "mkdir":
        fs.mkdir(p(0), mode=args[1])
    elif op == "unlink":
        fs.unlink(p(0))
    elif op == "rmdir":
        fs.rmdir(p(0))
    elif op == "rename":
        fs.rename(p(0), p(1))
    elif op == "link":
        fs.link(p(0), p(1))
    elif op == "symlink":
        fs.symlink(args[0], p(1))
    elif op == "chmod":
        fs.chmod(p(0), args[1])
    elif op == "chown":
        fs.chown(p(0), args[1], args[2])
    elif op == "truncate":
        fs.truncate(p(0), args[1])
    elif op == "utime":
        fs.utime(p(0), ns=(1, 1))
    elif op == "utime_now":
        fs.utime(p(0))
    elif op == "readlink":
        fs.readlink(p(0))
    else:
        raise AssertionError(op)


@pytest.mark.skipif(os.geteuid() != 0, reason="the local side needs root (build other users' files, setresuid)")
def test_matrix_end_to_end(cluster: LocalCluster, fs: loomfs.LoomFS, tmp_path: Path) -> None:
    cases = _cases()
    proc = subprocess.run([sys.executable, str(_UNIT), "--local"], input=json.dumps(cases), capture_output=True,
                          text=True, timeout=120, check=True)
    local = json.loads(proc.stdout)
    secret = load_secret_file(cluster.secret_path)
    clients: dict[str, loomfs.LoomFS] = {}
    for user in USERS:
        uid, gid, groups = M.USERS[user]
        cred = create_token(secret, uid=uid, gid=gid, groups=groups, rights=rights_for(), ttl_s=600,
                            now_s=time.time())
        write_token_file(tmp_path / user, cred)
        clients[user] = loomfs.connect(str(cluster.root), config=ClientConfig(rpc=RpcConfig(
            token_file=str(tmp_path / user))), consistency="strict")
    base = f"/permmatrix-{os.getpid()}-{time.monotonic_ns()}"
    fs.mkdir(base, mode=0o755)
    diffs = []
    try:
        for i, ((user, op, args), (lcode, lshown)) in enumerate(zip(cases, local, strict=True)):
            root = f"{base}/c{i}"
            _build(fs, root)
            code = 0
            try:
                _op(clients[user], root, op, args)
            except OSError as exc:
                code = exc.errno or -1
            shown = None
            show = M.SHOW.get(op)
            if show is not None:
                try:
                    a = fs.lstat(f"{root}/{args[show]}")
                    shown = [a.st_uid, a.st_gid, stat.S_IMODE(a.st_mode)]
                except OSError:
                    shown = None
            if (code, shown) != (lcode, lshown):
                diffs.append(f"{op}{tuple(args)} as {user}: local {M._fmt(lcode, lshown)}, "
                             f"LoomFS {M._fmt(code, shown)}")
    finally:
        for c in clients.values():
            c.close()
    assert not diffs, f"{len(diffs)} of {len(cases)} differ:\n" + "\n".join(diffs)
    assert {code for code, _ in local} >= {0, 1, 13}
