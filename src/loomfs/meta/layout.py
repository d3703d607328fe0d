"""Layouts: validation, defaults, and the chain choice for new files (pure functions)."""

from __future__ import annotations

import random

from loomfs.common.routing import Routing
from loomfs.errors import StatusError
from loomfs.wire.status import Status
from loomfs.wire.types import ChainTable, Layout, TargetState

CHUNK_SIZE_MIN_BYTES = 64 << 10
CHUNK_SIZE_MAX_BYTES = 64 << 20
# no directory may ask for more: inline bytes travel in the frame header (1 MiB at most)
INLINE_MAX_BYTES_CAP = 512 << 10
EC_WIDTH_MAX = 32  # k + m


def validate_dir_layout(layout: Layout | None) -> Layout:
    """The layout a directory stores (chains cleared). EINVAL if out of range."""
    if layout is None:
        raise StatusError(Status.EINVAL, "layout missing")
    cs = layout.chunk_size
    if cs < CHUNK_SIZE_MIN_BYTES or cs > CHUNK_SIZE_MAX_BYTES or cs & (cs - 1):
        raise StatusError(
            Status.EINVAL, f"chunk_size must be a power of two in [64 KiB, 64 MiB], got {cs}"
        )
    if layout.stripe < 1:
        raise StatusError(Status.EINVAL, f"stripe must be >= 1, got {layout.stripe}")
    if layout.table_id < 0 or layout.replicas < 0:
        raise StatusError(Status.EINVAL, "table_id and replicas must be >= 0")
    if not -1 <= layout.inline_max_bytes <= INLINE_MAX_BYTES_CAP:
        raise StatusError(
            Status.EINVAL, f"inline_max_bytes must be -1 (default), 0 (off) or up to {INLINE_MAX_BYTES_CAP}"
        )
    if layout.ec_k or layout.ec_m:
        if layout.ec_k < 1 or layout.ec_m < 1 or layout.ec_k + layout.ec_m > EC_WIDTH_MAX:
            raise StatusError(Status.EINVAL, f"ec needs k >= 1, m >= 1, k + m <= {EC_WIDTH_MAX}; "
                                             f"got {layout.ec_k}+{layout.ec_m}")
        if layout.replicas > 1:
            raise StatusError(Status.EINVAL, "an ec layout uses single-replica chains (replicas 1)")
    ec = layout.ec_k > 0
    return Layout(
        chunk_size=cs, stripe=layout.ec_k + layout.ec_m if ec else layout.stripe, table_id=layout.table_id,
        replicas=1 if ec else layout.replicas, inline_max_bytes=0 if ec else layout.inline_max_bytes,
        ec_k=layout.ec_k, ec_m=layout.ec_m, durable=layout.durable,
    )


def pick_ec_chains(routing: Routing, chain_ids: list[int], width: int, position: int) -> list[int]:
    """``width`` chains of the table on distinct nodes, scanning from ``position`` (wrapping):
    an EC group (its fragments rotate over these chains). Chains whose target serves come
    first (a new file is not placed on a dead server while live ones are free). EINVAL when
    the table spans fewer nodes."""
    n = len(chain_ids)
    order = [chain_ids[(position + i) % n] for i in range(n)]

    def node_and_serving(cid: int) -> tuple[int, bool] | None:
        chain = routing.chains.get(cid)
        if chain is None or not chain.targets:
            return None
        t = routing.targets.get(chain.targets[0])
        if t is None:
            return (-cid, False)
        return (t.node_id, t.state == TargetState.SERVING)

    picked: list[int] = []
    nodes: set[int] = set()
    for want_serving in (True, False):
        for cid in order:
            info = node_and_serving(cid)
            if info is None or cid in picked or info[0] in nodes or (want_serving and not info[1]):
                continue
            nodes.add(info[0])
            picked.append(cid)
            if len(picked) == width:
                return picked
    raise StatusError(Status.EINVAL, f"ec with k+m={width} needs {width} storage nodes; the "
                                     f"single-replica chain table spans {len(nodes)}")


def pick_chains(chain_ids: list[int], stripe: int, position: int) -> list[int]:
    """``min(stripe, len)`` consecutive chains of the table starting at ``position`` (wrapping)."""
    n = len(chain_ids)
    if n == 0:
        raise StatusError(Status.NO_CHAIN_TABLE, "chain table has no chains")
    width = min(max(1, stripe), n)
    start = position % n
    return [chain_ids[(start + i) % n] for i in range(width)]


class ChainAllocator:
    """Round-robin start positions per chain table, randomised per meta process by a seed."""

    def __init__(self, rng: random.Random, tables_max: int = 1024):
        self._rng = rng
        self._cursor: dict[int, int] = {}
        self._tables_max = tables_max
        self.files_placed = 0

    def file_layout(self, table: ChainTable, parent: Layout, routing: Routing | None = None, *,
                    inline_max_bytes: int | None = None) -> Layout:
        """A new file's layout under directory layout ``parent``; ``inline_max_bytes``: the
        file's inline limit (None: the default, -1; 0 for erasure-coded files)."""
        n = len(table.chain_ids)
        if n == 0:
            raise StatusError(Status.NO_CHAIN_TABLE, f"chain table {table.table_id} has no chains")
        pos = self._cursor.get(table.table_id)
        if pos is None:
            if len(self._cursor) >= self._tables_max:
                self._cursor.clear()
            pos = self._rng.randrange(n)
        self._cursor[table.table_id] = (pos + 1) % n
        self.files_placed += 1
        if parent.ec_k:
            if routing is None:
                raise StatusError(Status.NO_CHAIN_TABLE, "no routing: cannot place an erasure-coded file")
            width = parent.ec_k + parent.ec_m
            return Layout(chunk_size=parent.chunk_size, stripe=width, table_id=table.table_id, replicas=1,
                          chains=pick_ec_chains(routing, list(table.chain_ids), width, pos),
                          inline_max_bytes=inline_max_bytes or 0, ec_k=parent.ec_k, ec_m=parent.ec_m,
                          durable=parent.durable)
        return Layout(
            chunk_size=parent.chunk_size,
            stripe=parent.stripe,
            table_id=table.table_id,
            replicas=table.replicas,
            chains=pick_chains(list(table.chain_ids), parent.stripe, pos),
            inline_max_bytes=-1 if inline_max_bytes is None else inline_max_bytes,
            durable=parent.durable,
        )

    def __repr__(self) -> str:
        return f"ChainAllocator(tables={len(self._cursor)} files={self.files_placed})"
