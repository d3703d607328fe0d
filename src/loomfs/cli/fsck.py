"""``loomfs admin fsck [--repair]``: check namespace <-> chunks.

Lists every chunk on every storage target, then walks the namespace (in that order, so a
chunk of a file created meanwhile is never taken for an orphan). Reports:

* orphans: chunks whose inode is no file in the namespace. Right after an unlink these are
  the GC's to remove (after ``gc_delay_s``, once no write session holds the file); found
  later, they are a leak. With ``--repair`` they are removed through their chain after a
  second walk ``--grace-s`` later confirms the inode is still gone (an unlinked file still
  open for write loses its data: repair with the GC queue drained, ``statfs().gc_pending``);
* missing replicas: a chunk held by fewer serving members of its chain than others hold;
* bad lengths: a chunk longer than the file's chunk size;
* bad inline files: a file whose bytes live in meta (``Attr.inline``) and do not match their
  CRC32C or length (read back with READ; meta checks the CRC). Chunks of an inline file are
  never read: a migration that did not finish leaves some, and GC removes them with the file.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from typing import Any

import crc32c

import loomfs
from loomfs.client import paths as _paths
from loomfs.wire.types import FileType, Layout, TargetState


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

    @property
    def clean(self) -> bool:
        return not (self.orphans or self.missing or self.bad_lengths or self.bad_inline)


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


def fsck(fs: loomfs.LoomFS, cluster_chunks: Any, routing: Any, *, repair: bool = False,
         grace_s: float = 10.0) -> FsckReport:
    """``cluster_chunks()``: [(target_id, ChunkMeta)] of all targets (LocalCluster.chunks_of(0))."""
    rep = FsckReport()
    states = {t.target_id: t for t in routing.targets}
    chunks = cluster_chunks()
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
    for c in routing.chains:
        serving = {t for t in c.targets if states[t].state == TargetState.SERVING}
        for (chain_id, inode, index), have in holders.items():
            if chain_id == c.chain_id and have != serving and inode in names:
                rep.missing.append(f"chain {chain_id} chunk {inode:x}/{index}: on {sorted(have)} of {sorted(serving)}")
    if repair and rep.orphans:
        time.sleep(grace_s)
        still = _namespace(fs)
        for inode, places in list(rep.orphans.items()):
            if inode in still:
                del rep.orphans[inode]
                continue
            chains = sorted({chain for chain, _ in places})
            fs.run(fs.client.storage.remove_chunks(Layout(chains=chains, stripe=len(chains)), inode, 0))
            rep.removed += len(places)
    return rep


def cmd_fsck(args: argparse.Namespace) -> int:
    from loomfs.cli.admin import fetch_routing
    from loomfs.cli.common import target
    from loomfs.testing.cluster import LocalCluster

    c = LocalCluster.from_dir(target(args))
    fs = loomfs.connect(str(c.root))
    try:
        rep = fsck(fs, lambda: c.chunks_of(0), fetch_routing(args), repair=args.repair, grace_s=args.grace_s)
    finally:
        fs.close()
    print(f"fsck: {rep.files} files, {rep.chunks} chunk replicas; {sum(map(len, rep.orphans.values()))} orphan "
          f"chunks of {len(rep.orphans)} inodes, {len(rep.missing)} missing replicas, {len(rep.bad_lengths)} bad lengths")
    print(f"fsck: {rep.inline_files} inline files, {len(rep.bad_inline)} bad")
    for line in rep.missing[:20] + rep.bad_lengths[:20] + rep.bad_inline[:20]:
        print("  " + line)
    if args.repair:
        print(f"fsck: removed {rep.removed} orphan chunks")
    return 0 if rep.clean or (args.repair and not rep.missing and not rep.bad_lengths) else 1
