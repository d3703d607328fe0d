"""Namespace check over the MetaStore seam (any engine): is the tree a tree?

Walks every directory from the root, in one read transaction (one snapshot), and reports:

* dangling entries: a directory entry whose inode is missing, or whose type differs from the
  inode's;
* directories reached twice (a second parent, or a cycle through the root's subtree);
* link counts: a file's ``nlink`` that differs from the entries naming it; a directory's that
  differs from 2 + its subdirectories;
* counters: the store's ``files``/``directories`` counters against what the walk found (a
  directory cut off from the root in a cycle, or an inode no entry names, shows up here);
* directory entries whose parent is not a directory;
* orphans (``loomfs.meta.orphans``): each a nameless file with ``nlink`` 0, counted in
  ``files``.

Used by the multi-meta concurrency tests (``tests/test_multimeta.py``) after a storm of
renames, exclusive creates and link/unlink from several meta servers at once.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from loomfs.meta.store.base import MetaStore
from loomfs.wire.types import ROOT_INODE, Attr, FileType

PAGE = 1000
_DIR = int(FileType.DIRECTORY)
_FILE = int(FileType.FILE)


@dataclass
class NamespaceReport:
    directories: int = 0
    files: int = 0
    symlinks: int = 0
    entries: int = 0
    orphans: int = 0  # nameless files kept for the clients that hold them open
    problems: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        head = (f"{self.directories} directories, {self.files} files, {self.symlinks} symlinks, "
                f"{self.entries} entries" + (f", {self.orphans} orphans" if self.orphans else ""))
        if self.clean:
            return head + ": clean"
        return head + f": {len(self.problems)} problems\n  " + "\n  ".join(self.problems[:50])


async def check_namespace(store: MetaStore, *, problems_max: int = 1000) -> NamespaceReport:
    r = NamespaceReport()

    def bad(msg: str) -> None:
        if len(r.problems) < problems_max:
            r.problems.append(msg)

    async with store.read() as txn:
        root = await txn.get_inode(ROOT_INODE)
        if root is None or root.type != _DIR:
            bad("no root directory")
            return r
        seen_dirs: set[int] = {ROOT_INODE}
        names_of: Counter[int] = Counter()  # non-directory inode -> entries naming it
        attrs: dict[int, Attr] = {ROOT_INODE: root}
        pending = [ROOT_INODE]
        while pending:
            d = pending.pop()
            subdirs = 0
            after = ""
            while True:
                page = await txn.list_dentries(d, after, PAGE)
                if not page:
                    break
                after = page[-1].name
                got = await txn.get_inodes([e.inode for e in page])
                for e in page:
                    r.entries += 1
                    a = got.get(e.inode)
                    where = f"dir {d} entry {e.name!r} -> inode {e.inode}"
                    if a is None:
                        bad(f"{where}: no such inode")
                        continue
                    if a.type != e.type:
                        bad(f"{where}: entry type {e.type}, inode type {a.type}")
                    if a.type == _DIR:
                        subdirs += 1
                        if e.inode in seen_dirs:
                            bad(f"{where}: directory reached twice (second parent or cycle)")
                            continue
                        seen_dirs.add(e.inode)
                        attrs[e.inode] = a
                        pending.append(e.inode)
                    else:
                        names_of[e.inode] += 1
                        attrs[e.inode] = a
                if len(page) < PAGE:
                    break
            if attrs[d].nlink != 2 + subdirs:
                bad(f"dir {d}: nlink {attrs[d].nlink}, expected {2 + subdirs} (2 + {subdirs} subdirectories)")
        for ino, n in names_of.items():
            a = attrs[ino]
            if a.nlink != n:
                bad(f"inode {ino}: nlink {a.nlink}, named by {n} entries")
            if a.type == _FILE:
                r.files += 1
            else:
                r.symlinks += 1
        r.directories = len(seen_dirs)
        orphaned = 0  # files kept with no name while clients hold them (loomfs.meta.orphans)
        after_ino = 0
        while True:
            held = await txn.orphan_list(after_ino, PAGE)
            if not held:
                break
            after_ino = held[-1][0]
            found = await txn.get_inodes([i for i, _ in held])
            for ino, _since in held:
                a = found.get(ino)
                if a is None:
                    bad(f"orphan {ino}: no such inode")
                    continue
                if ino in names_of:
                    bad(f"orphan {ino}: named by {names_of[ino]} entries")
                elif a.nlink != 0 or a.type != _FILE:
                    bad(f"orphan {ino}: nlink {a.nlink}, type {a.type} (a nameless file has nlink 0)")
                else:
                    orphaned += 1
            if len(held) < PAGE:
                break
        r.orphans = orphaned
        counters = await txn.counters()
        if counters.get("files", 0) != r.files + orphaned:
            bad(f"files counter {counters.get('files', 0)}, {r.files} files reachable + {orphaned} orphans")
        if counters.get("directories", 0) != r.directories:
            bad(f"directories counter {counters.get('directories', 0)}, {r.directories} reachable")
    return r
