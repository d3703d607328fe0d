"""Who the running namespace operation acts for (a context variable).

The meta RPC adapters set it from the connection's identity (``CallContext.identity``, never a
request body) before calling the namespace; every request runs in its own task, so the value
stays with that request. Code that calls the namespace directly (GC, tools, tests) runs as
``TRUSTED`` (uid 0, every right) unless it says otherwise with ``acting_as``.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

from loomfs.common.identity import TRUSTED, Identity
from loomfs.meta.perm import effective

CALLER: contextvars.ContextVar[Identity] = contextvars.ContextVar("loomfs_meta_caller", default=TRUSTED)


def caller() -> Identity:
    return CALLER.get()


def set_caller(who: Identity, *, root_squash: bool = False) -> None:
    """For the rest of this task (one RPC request): act as ``who`` (squashed if asked)."""
    CALLER.set(effective(who, root_squash=root_squash))


@contextlib.contextmanager
def acting_as(who: Identity, *, root_squash: bool = False) -> Iterator[Identity]:
    """``with acting_as(Identity(uid=1000, gid=1000)): await ns.stat(...)``."""
    token = CALLER.set(effective(who, root_squash=root_squash))
    try:
        yield CALLER.get()
    finally:
        CALLER.reset(token)
