"""The mount's bookkeeping of open files kept past their last name (no I/O)."""

from __future__ import annotations

import subprocess
import sys

from loomfs.mount.orphans import ORPHANS_DIR, Orphans, hidden


def test_names_are_unique_and_released_once() -> None:
    o = Orphans(host="node-a", pid=4242)
    p1, p2 = o.new_path(7), o.new_path(7)
    assert p1 != p2 and p1.startswith(f"{ORPHANS_DIR}/node-a-4242-7-")
    o.kept(7, p1)
    assert 7 in o and o.path(7) == p1 and o.inodes() == [7]
    assert o.release(7) == p1 and o.release(7) is None and 7 not in o
    assert "kept_total=1" in repr(o)


def test_stale_names_are_this_hosts_dead_mounts_only() -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    dead_pid = int(dead.stdout)  # exited: no such process (pids are not reused this fast)
    o = Orphans(host="my-host", pid=100)
    names = [
        f"my-host-{dead_pid}-5-1",  # this host, a dead mount: stale
        "my-host-100-6-1",  # this mount itself
        f"my-host-{o_alive()}-7-1",  # a live process
        f"other-host-{dead_pid}-8-1",  # another host's: never touched
        "my-host-notapid-9-1",
        "garbage",
    ]
    assert o.stale(names) == [f"my-host-{dead_pid}-5-1"]


def o_alive() -> int:
    import os

    return os.getpid()


def test_only_the_roots_orphans_directory_is_hidden() -> None:
    assert hidden("/", b".loomfs-orphans")
    assert not hidden("/d", b".loomfs-orphans") and not hidden("/", b".loomfs-orphans2")
