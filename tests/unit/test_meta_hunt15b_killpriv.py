"""Hunt 15b: a truncate by a caller other than root drops the file's setuid bit, and its
setgid bit when group-executable (Linux: do_truncate -> should_remove_suid, for setattr of
the size and for O_TRUNC alike); root keeps them."""

from __future__ import annotations

import os
import stat

from test_meta_namespace import CREAT, Env

from loomfs.common.identity import Identity
from loomfs.meta.caller import acting_as

USER = Identity(uid=1000, gid=1000)


def _file(env: Env, mode: int) -> None:
    o = env.run(env.ns.open("/f", CREAT, uid=1000, gid=1000))
    env.run(env.ns.close(o.attr.inode, o.session_id, length=100))
    env.run(env.ns.setattr("/f", mode=mode))


def test_setattr_size_by_a_user_drops_setuid_and_group_exec_setgid() -> None:
    env = Env()
    _file(env, 0o6775)
    with acting_as(USER):
        a = env.run(env.ns.setattr("/f", size=10)).attr
    assert stat.S_IMODE(a.mode) == 0o775
    assert stat.S_IMODE(env.run(env.ns.stat("/f")).mode) == 0o775


def test_setgid_without_group_exec_stays() -> None:
    env = Env()
    _file(env, 0o6764)
    with acting_as(USER):
        env.run(env.ns.setattr("/f", size=0))
    assert stat.S_IMODE(env.run(env.ns.stat("/f")).mode) == 0o2764


def test_o_trunc_by_a_user_drops_setuid() -> None:
    env = Env()
    _file(env, 0o4755)
    with acting_as(USER):
        o = env.run(env.ns.open("/f", os.O_WRONLY | os.O_TRUNC, client_id=1))
        env.run(env.ns.close(o.attr.inode, o.session_id))
    assert stat.S_IMODE(env.run(env.ns.stat("/f")).mode) == 0o755


def test_root_keeps_the_bits() -> None:
    env = Env()
    _file(env, 0o6775)
    env.run(env.ns.setattr("/f", size=10))
    o = env.run(env.ns.open("/f", os.O_WRONLY | os.O_TRUNC))
    env.run(env.ns.close(o.attr.inode, o.session_id))
    assert stat.S_IMODE(env.run(env.ns.stat("/f")).mode) == 0o6775
