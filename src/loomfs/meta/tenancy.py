"""Tenants: each tenant's namespace is its own tree, in its own range of inode numbers.

A tenant has a small number (1..TENANT_MAX; 0 is the shared namespace of tenant-less callers)
kept in the top bits of every inode number it owns: ``inode >> TENANT_SHIFT``. So whether an
inode belongs to the caller's tenant is one shift and compare, with no store read and no
schema change. A tenant's inodes come from its own counter (``inode.t<N>``); its root
directory is ``root_of(N)``. A caller whose token names a tenant walks from that root (its
"/"; ``..`` stops there, absolute symlinks resolve there), and calls by inode number outside
its range answer ENOENT, as if the inode did not exist. The tenant's name -> number mapping
lives in the store's state table (``tenant/<name>``); a tenant is never renumbered, so every
meta server may cache it.
"""

from __future__ import annotations

import re

from loomfs.common.identity import TENANT_SHIFT as TENANT_SHIFT
from loomfs.errors import StatusError
from loomfs.meta.store.base import MetaTxn
from loomfs.wire.status import Status
from loomfs.wire.types import ROOT_INODE

# TENANT_SHIFT (48, in common.identity: storage checks it too): 2^48 inodes per tenant; 15 bits of
# tenants below SQLite's int64 sign bit
TENANT_MAX = (1 << 15) - 1
TENANT_KEY = "tenant/"
TENANT_COUNTER = "tenants"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

# name -> tenant number, per process (a tenant's number never changes once made)
_known: dict[str, int] = {}


def tenant_of(inode: int) -> int:
    return inode >> TENANT_SHIFT


def root_of(tenant: int) -> int:
    return (tenant << TENANT_SHIFT) | ROOT_INODE


def counter_of(tenant: int) -> str:
    """The store counter a tenant's inode numbers come from ("inode" for the shared namespace)."""
    return f"inode.t{tenant}" if tenant else "inode"


def inode_in(tenant: int, n: int) -> int:
    """Inode number ``n`` of ``tenant``'s range (ENOSPC when the range is used up)."""
    if n >= 1 << TENANT_SHIFT:
        raise StatusError(Status.ENOSPC, f"tenant {tenant}: no inode numbers left")
    return (tenant << TENANT_SHIFT) | n


def check_name(name: str) -> None:
    if not _NAME.fullmatch(name):
        raise StatusError(Status.EINVAL, f"tenant name {name!r}: 1-64 of [A-Za-z0-9._-], not starting with . - _")


async def tenant_number(txn: MetaTxn, name: str) -> int:
    """The number of tenant ``name`` (0 for ""); EACCES for a tenant that does not exist (a token
    for a tenant nobody created sees nothing)."""
    if not name:
        return 0
    n = _known.get(name)
    if n is not None:
        return n
    raw = await txn.state_get(TENANT_KEY + name)
    if raw is None:
        raise StatusError(Status.EACCES, f"tenant {name!r} does not exist")
    n = _known[name] = int(raw)
    return n


async def confine(txn: MetaTxn, name: str, inode: int) -> None:
    """A call by inode number from a (non-privileged) caller of tenant ``name``: ENOENT outside
    its range; a tenant-less caller's range is the shared namespace's (tenant 0)."""
    if tenant_of(inode) != await tenant_number(txn, name):
        raise StatusError(Status.ENOENT, f"inode {inode}")
