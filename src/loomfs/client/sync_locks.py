"""Blocking shortcuts for cluster-wide locks (``loomfs.client.locks``) on a ``LoomFS``:

    from loomfs.client.sync_locks import lock, unlock, locked
    lock(fs, "/jobs/queue")                 # exclusive flock-style lock, waits until granted
    lock(fs, "/jobs/queue", READ, wait=False)   # shared; BlockingIOError when another holds it
    unlock(fs, "/jobs/queue")
    with locked(fs, "/db", first=0, last=4095, kind=POSIX):   # a byte range, unlocked at exit
        ...

Each call is one meta RPC (a blocking wait polls, ``loomfs.client.locks``); locks conflict
with every other client and mount of the cluster (a mount's ``flock``/``fcntl``). The owner
defaults to one per client (two ``LoomFS`` objects conflict like two processes); pass
``owner=`` to lock as several owners from one client. ``LoomFS.lock``/``unlock`` methods are
these functions (wired by the blocking API's owner).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from loomfs.client import locks as _locks
from loomfs.client.locks import FLOCK, OFFSET_MAX, POSIX, READ, UNLOCK, WRITE

if TYPE_CHECKING:
    from loomfs.client.sync import LoomFS

__all__ = ["FLOCK", "OFFSET_MAX", "POSIX", "READ", "UNLOCK", "WRITE", "lock", "locked", "unlock"]


def lock(fs: LoomFS, path: str, type_: int = WRITE, *, kind: int = FLOCK, first: int = 0,
         last: int = OFFSET_MAX, owner: int | None = None, wait: bool = True,
         wait_max_s: float | None = None) -> None:
    """Lock ``path`` (READ shared / WRITE exclusive; UNLOCK unlocks) for the whole cluster.
    ``wait=False``: BlockingIOError when refused; a wait past ``wait_max_s`` too."""
    fs.run(_locks.lock(fs.client, path, type_, kind=kind, first=first, last=last, owner=owner, wait=wait,
                       wait_max_s=wait_max_s))


def unlock(fs: LoomFS, path: str, *, kind: int = FLOCK, first: int = 0, last: int = OFFSET_MAX,
           owner: int | None = None) -> None:
    fs.run(_locks.unlock(fs.client, path, kind=kind, first=first, last=last, owner=owner))


@contextlib.contextmanager
def locked(fs: LoomFS, path: str, type_: int = WRITE, *, kind: int = FLOCK, first: int = 0,
           last: int = OFFSET_MAX, owner: int | None = None, wait: bool = True,
           wait_max_s: float | None = None) -> Iterator[None]:
    """``lock`` for the ``with`` block; unlocked at its end (also on an exception)."""
    lock(fs, path, type_, kind=kind, first=first, last=last, owner=owner, wait=wait, wait_max_s=wait_max_s)
    try:
        yield
    finally:
        unlock(fs, path, kind=kind, first=first, last=last, owner=owner)
