"""File commands: ls, stat, put, get, cat, mkdir, rm, mv."""

from __future__ import annotations

import argparse
import errno
import grp
import os
import pwd
import stat as stat_mod
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, Progress, ProgressColumn, Task
from rich.text import Text

from loomfs.cli.common import connect, human_bytes
from loomfs.client import paths as _paths

COPY_BLOCK_BYTES = 16 << 20
PROGRESS_MIN_BYTES = 32 << 20


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ls", help="list a directory", add_help=False)
    p.add_argument("--help", action="help", help="show this help message and exit")
    p.add_argument("path", nargs="?", default="/")
    p.add_argument("-l", action="store_true", dest="long", help="long format: type and mode, links, owner, group, size")
    p.add_argument("-h", "--human-readable", action="store_true", dest="human",
                   help="with -l: sizes in binary units (1.5K, 3.0M, 2.0G)")
    p.set_defaults(func=cmd_ls)

    p = sub.add_parser("stat", help="show a file's attributes and layout")
    p.add_argument("path")
    p.set_defaults(func=cmd_stat)

    p = sub.add_parser("put", help="copy a local file into LoomFS (into REMOTE if it is a directory)")
    p.add_argument("local")
    p.add_argument("remote")
    p.add_argument("-p", "--parents", action="store_true", help="create missing parent directories")
    p.add_argument("-f", "--force", action="store_true", help="overwrite an existing file")
    p.set_defaults(func=cmd_put)

    p = sub.add_parser("get", help="copy a LoomFS file to a local path")
    p.add_argument("remote")
    p.add_argument("local")
    p.set_defaults(func=cmd_get)

    p = sub.add_parser("cat", help="write a file's bytes to stdout")
    p.add_argument("path")
    p.set_defaults(func=cmd_cat)

    p = sub.add_parser("mkdir", help="make a directory")
    p.add_argument("path")
    p.add_argument("-p", "--parents", action="store_true")
    p.set_defaults(func=cmd_mkdir)

    p = sub.add_parser("rm", help="remove a file (or a tree with -r)")
    p.add_argument("path")
    p.add_argument("-r", "--recursive", action="store_true")
    p.set_defaults(func=cmd_rm)

    p = sub.add_parser("mv", help="rename (atomically); into DST if DST is a directory or ends in /")
    p.add_argument("src")
    p.add_argument("dst")
    p.set_defaults(func=cmd_mv)


_TYPE_BITS = {"directory": stat_mod.S_IFDIR, "link": stat_mod.S_IFLNK, "file": stat_mod.S_IFREG}


def mode_text(entry: dict[str, Any]) -> str:
    """``drwxr-xr-x`` / ``lrwxrwxrwx`` / ``-rw-r--r--``: the type from the entry's ``type``
    (the wire mode holds only permission bits), the rest from its mode."""
    bits = _TYPE_BITS.get(entry["type"], 0)
    return stat_mod.filemode(bits | (entry["mode"] & 0o7777)) if bits else "?" + stat_mod.filemode(entry["mode"])[1:]


def owner_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return str(uid)


def group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except (KeyError, OverflowError):
        return str(gid)


def short_size(n: int) -> str:
    """``ls -h`` style, binary units: 512, 1.5K, 3.0M, 2.0G."""
    value = float(n)
    for unit in ("", "K", "M", "G", "T", "P"):
        if value < 1024 or unit == "P":
            return f"{int(value)}" if not unit else f"{value:.1f}{unit}"
        value /= 1024
    return f"{value:.1f}P"


def long_lines(entries: list[dict[str, Any]], human: bool) -> list[str]:
    rows = []
    for e in entries:
        name = e["name"].rsplit("/", 1)[-1]
        if e["type"] == "link" and e.get("destination"):
            name += f" -> {e['destination']}"
        mtime = datetime.fromtimestamp(e["mtime_ns"] / 1e9).strftime("%Y-%m-%d %H:%M")
        size = short_size(e["size"]) if human else str(e["size"])
        rows.append((mode_text(e), str(e["nlink"]), owner_name(e["uid"]), group_name(e["gid"]), size, mtime, name))
    widths = [max((len(r[i]) for r in rows), default=0) for i in range(5)]
    return [f"{r[0]} {r[1]:>{widths[1]}} {r[2]:<{widths[2]}} {r[3]:<{widths[3]}} {r[4]:>{widths[4]}} {r[5]} {r[6]}"
            for r in rows]


def cmd_ls(args: argparse.Namespace) -> int:
    with connect(args) as fs:
        entries = fs.ls(args.path, detail=True)
        if args.long:
            for line in long_lines(entries, args.human):
                print(line)
            return 0
        for e in entries:
            name = e["name"].rsplit("/", 1)[-1]
            print(name + ("/" if e["type"] == "directory" else ""))
    return 0


def cmd_stat(args: argparse.Namespace) -> int:
    with connect(args) as fs:
        st = fs.stat(args.path)
        print(f"  path: {args.path}")
        print(f"  type: {'directory' if stat_mod.S_ISDIR(st.st_mode) else 'symlink' if stat_mod.S_ISLNK(st.st_mode) else 'file'}")
        print(f"  size: {st.st_size} ({human_bytes(st.st_size)})")
        print(f"  mode: {stat_mod.filemode(st.st_mode)} ({st.st_mode & 0o7777:o})  uid={st.st_uid} gid={st.st_gid}")
        print(f" inode: {st.st_ino}  links: {st.st_nlink}")
        print(f" mtime: {datetime.fromtimestamp(st.st_mtime).isoformat()}")
        lay = fs.get_layout(args.path)
        if lay is not None:
            print(f"layout: chunk_size={human_bytes(lay.chunk_size)} stripe={lay.stripe} "
                  f"table={lay.table_id} chains={list(lay.chains) or '-'}")
    return 0


class BytesColumn(ProgressColumn):
    """``12.0 MiB / 200.0 MiB``: binary units, as every other figure the CLI prints."""

    def render(self, task: Task) -> Text:
        total = human_bytes(task.total) if task.total is not None else "?"
        return Text(f"{human_bytes(task.completed)} / {total}", style="progress.download")


class RateColumn(ProgressColumn):
    """``95.3 MiB/s`` (binary units)."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("?" if speed is None else f"{human_bytes(speed)}/s", style="progress.data.speed")


def progress_bar(transient: bool = True) -> Progress:
    return Progress("[progress.description]{task.description}", BarColumn(), BytesColumn(), RateColumn(),
                    transient=transient)


def _progress(total: int) -> Progress | None:
    if total < PROGRESS_MIN_BYTES or not sys.stderr.isatty():
        return None
    return progress_bar()


def _copy(src: Any, dst: Any, total: int, label: str) -> int:
    buf = bytearray(COPY_BLOCK_BYTES)
    mv = memoryview(buf)
    done = 0
    prog = _progress(total)
    task = prog.add_task(label, total=total) if prog else None
    if prog:
        prog.start()
    try:
        while True:
            n = src.readinto(mv)
            if not n:
                break
            dst.write(mv[:n])
            done += n
            if prog and task is not None:
                prog.update(task, completed=done)
    finally:
        if prog:
            prog.stop()
    return done


def put_destination(fs: Any, local: str, remote: str, *, parents: bool, force: bool) -> tuple[str, bool]:
    """Where ``put LOCAL REMOTE`` writes, and whether it replaces a file: into REMOTE when it
    is a directory (or ends in ``/``), like ``cp``. A missing parent is created with
    ``parents`` and otherwise refused (ENOENT, naming it and ``-p``); an existing file is
    replaced only with ``force`` (EEXIST otherwise)."""
    dst = _paths.normalize(remote)
    if remote.endswith("/") or fs.isdir(dst):
        dst = _paths.join(dst, os.path.basename(local))
    parent, _ = _paths.split(dst)
    if not fs.isdir(parent):
        if fs.exists(parent):
            raise NotADirectoryError(errno.ENOTDIR, f"{parent} is not a directory", dst)
        if not parents:
            raise FileNotFoundError(errno.ENOENT, f"parent directory {parent} does not exist "
                                                  f"(pass -p to create it)", dst)
        fs.makedirs(parent, exist_ok=True)
    replaced = fs.exists(dst)
    if replaced and fs.isdir(dst):
        raise IsADirectoryError(errno.EISDIR, "is a directory", dst)
    if replaced and not force:
        raise FileExistsError(errno.EEXIST, "exists (pass --force to overwrite it)", dst)
    return dst, replaced


def cmd_put(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    total = os.path.getsize(args.local)
    with connect(args) as fs:
        dst_path, replaced = put_destination(fs, args.local, args.remote, parents=args.parents, force=args.force)
        with open(args.local, "rb") as src, fs.open(dst_path, "wb") as dst:
            n = _copy(src, dst, total, f"put {Path(args.local).name}")
    dt = time.perf_counter() - t0
    verb = " (overwrote the existing file)" if replaced else ""
    print(f"{args.local} -> {dst_path}: {human_bytes(n)} in {dt:.2f}s ({human_bytes(n / max(dt, 1e-9))}/s){verb}",
          file=sys.stderr)
    return 0


def cmd_get(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    with connect(args) as fs:
        total = fs.stat(args.remote).st_size
        with fs.open(args.remote, "rb") as src, open(args.local, "wb") as dst:
            n = _copy(src, dst, total, f"get {args.remote.rsplit('/', 1)[-1]}")
    dt = time.perf_counter() - t0
    print(f"{args.remote} -> {args.local}: {human_bytes(n)} in {dt:.2f}s ({human_bytes(n / max(dt, 1e-9))}/s)",
          file=sys.stderr)
    return 0


def cmd_cat(args: argparse.Namespace) -> int:
    with connect(args) as fs, fs.open(args.path, "rb") as src:
        out = sys.stdout.buffer
        while True:
            b = src.read(COPY_BLOCK_BYTES)
            if not b:
                break
            out.write(b)
        out.flush()
    return 0


def cmd_mkdir(args: argparse.Namespace) -> int:
    with connect(args) as fs:
        if args.parents:
            fs.makedirs(args.path, exist_ok=True)
        else:
            fs.mkdir(args.path)
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    with connect(args) as fs:
        fs.rm(args.path, recursive=args.recursive)
    return 0


def mv_destination(fs: Any, src: str, dst: str) -> str:
    """``mv SRC DIR`` / ``mv SRC DIR/`` moves into DIR (keeping SRC's name), like ``mv``."""
    d = _paths.normalize(dst)
    if dst.endswith("/") or fs.isdir(d):
        if not fs.isdir(d):
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", dst)
        name = _paths.split(_paths.normalize(src))[1]
        return _paths.join(d, name)
    return d


def cmd_mv(args: argparse.Namespace) -> int:
    with connect(args) as fs:
        fs.rename(args.src, mv_destination(fs, args.src, args.dst))
    return 0
