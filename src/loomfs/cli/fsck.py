"""``loomfs admin fsck [--repair]``: check namespace <-> chunks, on any cluster (``--dir`` or
``--mgmtd``: storage nodes are found through mgmtd's routing and asked over RPC).

Lists every chunk on every storage target (paged), then walks the namespace (in that order,
so a chunk of a file created meanwhile is never taken for an orphan). Reports:

* queued for GC: chunks of unlinked files that wait in meta's GC queue (``gc_delay_s``, or a
  write session still open): not orphans, the GC removes them; counted apart;
* orphans: chunks whose inode is no file in the namespace and not in the GC queue, and that
  are still there when asked again after the GC question (so a file the GC finished with
  during the check is not one) — a leak. With ``--repair`` they are removed through their
  chain after a second walk ``--grace-s`` later confirms the inode is still gone;
* missing replicas: a chunk held by fewer serving members of its chain than others hold;
* bad lengths: a chunk longer than the file's chunk size;
* bad inline files: a file whose bytes live in meta (``Attr.inline``) and do not match their
  CRC32C or length (read back with READ; meta checks the CRC). Chunks of an inline file are
  never read: a migration that did not finish leaves some, and GC removes them with the file.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import crc32c

import loomfs
from loomfs.client import paths as _paths
from loomfs.net.rpc import RpcClient
from loomfs.net.tcp import TcpTransport
from loomfs.net.transport import Address
from loomfs.wire import meta as wmeta
from loomfs.wire.storage import QUERY_CHUNKS, QueryChunksReq
from loomfs.wire.types import FileType, Layout, NodeKind, NodeState, RoutingInfo, TargetState

QUERY_PAGE_CHUNKS = 10_000
QUERY_TIMEOUT_S = 30.0


@dataclass
class FsckReport:
    files: int = 0
    chunks: int = 0
    orphans: dict[int, set[tuple[int, int]]] = field(default_factory=dict)  # inode -> {(chain, index)}
    missing: list[str] = field(default_factory=list)
    bad_lengths: list[str] = field(default_factory=list)
    inline_files: int = 0
    bad_inline: list[str] = field(default_factory=list)
    removed: int = 0
    gc_queued: dict[int, int] = field(default_factory=dict)  # inode -> chunks waiting for the GC
    gc_done: int = 0  # chunks the GC removed while the check ran (not orphans)
    # inode -> chunks of files meta holds that the walk from "/" did not reach (a tenant's tree,
    # or a file made during the check): never orphans, never removed
    held_elsewhere: dict[int, int] = field(default_factory=dict)
    unreachable: list[str] = field(default_factory=list)  # storage nodes that did not answer

    @property
    def clean(self) -> bool:
        return not (self.orphans or self.missing or self.bad_lengths or self.bad_inline or self.unreachable)


def _namespace(fs: loomfs.LoomFS, rep: FsckReport | None = None) -> dict[int, Layout | None]:
    """inode -> layout of every file; with ``rep``, inline files are read back and checked."""
    out: dict[int, Layout | None] = {}
    for top, _dirs, files in fs.walk("/"):
        for name in files:
            path = _paths.join(top, name)
            try:
                a = fs.attr(path, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if a.type != FileType.FILE:
                continue
            out[a.inode] = a.layout
            if rep is not None and a.inline:
                rep.inline_files += 1
                _check_inline(fs, path, a.size, rep)
    return out


def _check_inline(fs: loomfs.LoomFS, path: str, size: int, rep: FsckReport) -> None:
    try:
        rsp = fs.run(fs.client.meta.read(path, False))
    except FileNotFoundError:
        return
    except OSError as exc:  # EIO: meta found the bytes do not match their CRC32C
        rep.bad_inline.append(f"{path}: {exc}")
        return
    if rsp.attr is None or not rsp.attr.inline:
        return  # moved to chunks meanwhile
    if rsp.data is None or len(rsp.data) != rsp.attr.size or crc32c.crc32c(rsp.data) != rsp.data_crc:
        rep.bad_inline.append(f"{path}: inline bytes do not match the length {size} or their CRC32C")


def list_chunks(routing: RoutingInfo, inode: int = 0, unreachable: list[str] | None = None) -> list[tuple[int, Any]]:
    """(target_id, ChunkMeta) of every chunk (of ``inode``; 0 = all) on every target of every
    alive storage node in ``routing``, paged; nodes that do not answer go to ``unreachable``."""
    nodes = {n.node_id: n for n in routing.nodes if n.kind == NodeKind.STORAGE and n.state == NodeState.ALIVE}

    async def go() -> list[tuple[int, Any]]:
        rpc = RpcClient(TcpTransport(), connect_timeout_s=2.0)
        out: list[tuple[int, Any]] = []
        try:
            for t in routing.targets:
                n = nodes.get(t.node_id)
                if n is None:
                    continue
                after = None
                try:
                    while True:
                        req = QueryChunksReq(target_id=t.target_id, inode=inode, limit=QUERY_PAGE_CHUNKS,
                                             after=after if inode == 0 else None)
                        body = (await rpc.call(Address(n.host, n.port), QUERY_CHUNKS, req,
                                               timeout_s=QUERY_TIMEOUT_S)).body
                        out += [(t.target_id, c) for c in body.chunks]
                        if not body.more or not body.chunks or inode != 0:
                            break
                        after = body.chunks[-1].chunk
                except OSError as exc:
                    if unreachable is not None:
                        unreachable.append(f"node {n.node_id} ({n.host}:{n.port}) target {t.target_id}: {exc}")
        finally:
            await rpc.close()
        return out

    return asyncio.run(go())


def gc_queued_inodes(fs: loomfs.LoomFS, inodes: list[int]) -> set[int]:
    """The ones of ``inodes`` that wait in meta's GC queue."""
    return _ask_inodes(fs, wmeta.GC_QUEUED, inodes)


def live_inodes(fs: loomfs.LoomFS, inodes: list[int]) -> set[int]:
    """The ones of ``inodes`` meta still holds as files, in any tenant's tree (``INODES_LIVE``,
    ADMIN): the walk from "/" does not enter tenants' roots."""
    return _ask_inodes(fs, wmeta.INODES_LIVE, inodes)


def _ask_inodes(fs: loomfs.LoomFS, method: Any, inodes: list[int]) -> set[int]:
    out: set[int] = set()
    step = wmeta.GC_QUEUED_INODES_MAX
    for i in range(0, len(inodes), step):
        body = fs.run(fs.client.meta.call(method, wmeta.InodesReq(inodes=inodes[i:i + step])))
        out.update(body.inodes)
    return out


def fsck(fs: loomfs.LoomFS, cluster_chunks: Callable[[], list[tuple[int, Any]]] | None, routing: Any, *,
         repair: bool = False, grace_s: float = 10.0) -> FsckReport:
    """``cluster_chunks()``: [(target_id, ChunkMeta)] of all targets (None: ``list_chunks``
    through ``routing``)."""
    rep = FsckReport()
    states = {t.target_id: t for t in routing.targets}
    chunks = cluster_chunks() if cluster_chunks is not None else list_chunks(routing, 0, rep.unreachable)
    names = _namespace(fs, rep)
    rep.files = len(names)
    holders: dict[tuple[int, int, int], set[int]] = {}  # (chain, inode, index) -> serving targets
    for tid, m in chunks:
        t = states.get(tid)
        if t is None or not t.chain_id or m.chunk is None or not m.commit_ver:
            continue
        rep.chunks += 1
        if t.state == TargetState.SERVING:
            holders.setdefault((t.chain_id, m.chunk.inode, m.chunk.index), set()).add(tid)
        layout = names.get(m.chunk.inode)
        if m.chunk.inode not in names:
            rep.orphans.setdefault(m.chunk.inode, set()).add((t.chain_id, m.chunk.index))
        elif layout is not None and m.length > layout.chunk_size:
            rep.bad_lengths.append(f"target {tid} chunk {m.chunk.inode:x}/{m.chunk.index}: {m.length} bytes "
                                   f"> chunk size {layout.chunk_size}")
    _sort_out_gc(fs, routing, rep)
    for c in routing.chains:
        serving = {t for t in c.targets if states[t].state == TargetState.SERVING}
        for (chain_id, inode, index), have in holders.items():
            if chain_id == c.chain_id and have != serving and inode in names:
                rep.missing.append(f"chain {chain_id} chunk {inode:x}/{index}: on {sorted(have)} of {sorted(serving)}")
    if repair and rep.orphans:
        time.sleep(grace_s)
        still = _namespace(fs)
        held = live_inodes(fs, sorted(rep.orphans))  # made in a tenant's tree meanwhile
        for inode, places in list(rep.orphans.items()):
            if inode in still or inode in held:
                del rep.orphans[inode]
                continue
            chains = sorted({chain for chain, _ in places})
            fs.run(fs.client.storage.remove_chunks(Layout(chains=chains, stripe=len(chains)), inode, 0))
            rep.removed += len(places)
    return rep


def _sort_out_gc(fs: loomfs.LoomFS, routing: RoutingInfo, rep: FsckReport) -> None:
    """Orphan candidates that wait in the GC queue are the GC's (``rep.gc_queued``); of the
    rest, those whose chunks are gone when asked again were the GC's too, finished during the
    check (an entry leaves the queue only after its chunks are removed)."""
    if not rep.orphans:
        return
    queued = gc_queued_inodes(fs, sorted(rep.orphans))
    for inode in queued:
        rep.gc_queued[inode] = len(rep.orphans.pop(inode))
    # files the walk did not reach but meta holds (tenants' trees, files created meanwhile)
    for inode in live_inodes(fs, sorted(rep.orphans)):
        rep.held_elsewhere[inode] = len(rep.orphans.pop(inode))
    chain_of = {t.target_id: t.chain_id for t in routing.targets}
    for inode in list(rep.orphans):
        still = {(chain_of.get(tid, 0), m.chunk.index) for tid, m in list_chunks(routing, inode)
                 if m.chunk is not None}
        left = rep.orphans[inode] & still
        rep.gc_done += len(rep.orphans[inode]) - len(left)
        if left:
            rep.orphans[inode] = left
        else:
            del rep.orphans[inode]


def cmd_fsck(args: argparse.Namespace) -> int:
    from loomfs.cli.admin import fetch_routing
    from loomfs.cli.common import target

    fs = loomfs.connect(target(args))
    try:
        rep = fsck(fs, None, fetch_routing(args), repair=args.repair, grace_s=args.grace_s)
    finally:
        fs.close()
    print(f"fsck: {rep.files} files, {rep.chunks} chunk replicas; {sum(map(len, rep.orphans.values()))} orphan "
          f"chunks of {len(rep.orphans)} inodes, {len(rep.missing)} missing replicas, {len(rep.bad_lengths)} bad lengths")
    print(f"fsck: {sum(rep.gc_queued.values())} chunks of {len(rep.gc_queued)} unlinked files wait in the "
          f"GC queue (not orphans; removed after gc_delay_s), {rep.gc_done} chunks removed by the GC during the check")
    print(f"fsck: {rep.inline_files} inline files, {len(rep.bad_inline)} bad")
    if rep.held_elsewhere:
        print(f"fsck: {sum(rep.held_elsewhere.values())} chunks of {len(rep.held_elsewhere)} files outside the "
              "tree from / (tenants' trees, or created during the check): not orphans, lengths not checked")
    for line in rep.unreachable[:20]:
        print("  unreachable: " + line)
    for line in rep.missing[:20] + rep.bad_lengths[:20] + rep.bad_inline[:20]:
        print("  " + line)
    if args.repair:
        print(f"fsck: removed {rep.removed} orphan chunks")
    return 0 if rep.clean or (args.repair and not rep.missing and not rep.bad_lengths) else 1
