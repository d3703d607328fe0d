"""File commands: ls, stat, put, get, cat, mkdir, rm, mv."""

from __future__ import annotations

import argparse
import os
import stat as stat_mod
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

from loomfs.cli.common import connect, human_bytes

COPY_BLOCK_BYTES = 16 << 20
PROGRESS_MIN_BYTES = 32 << 20


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ls", help="list a directory")
    p.add_argument("path", nargs="?", default="/")
    p.add_argument("-l", action="store_true", dest="long", help="long format")
    p.set_defaults(func=cmd_ls)

    p = sub.add_parser("stat", help="show a file's attributes and layout")
    p.add_argument("path")
    p.set_defaults(func=cmd_stat)

    p = sub.add_parser("put", help="copy a local file into LoomFS")
    p.add_argument("local")
    p.add_argument("remote")
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

    p = sub.add_parser("mv", help="rename (atomically)")
    p.add_argument("src")
    p.add_argument("dst")
    p.set_defaults(func=cmd_mv)


def _type_char(st: Any) -> str:
    if stat_mod.S_ISDIR(st.st_mode):
        return "d"
    if stat_mod.S_ISLNK(st.st_mode):
        return "l"
    return "-"


def cmd_ls(args: argparse.Namespace) -> int:
    with connect(args) as fs:
        entries = fs.ls(args.path, detail=True)
        for e in entries:
            name = e["name"].rsplit("/", 1)[-1]
            if args.long:
                mode = stat_mod.filemode(e["mode"])
                mtime = datetime.fromtimestamp(e["mtime_ns"] / 1e9).strftime("%Y-%m-%d %H:%M")
                print(f"{mode} {e['nlink']:>3} {e['size']:>14} {mtime} {name}")
            else:
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


def _progress(total: int) -> Progress | None:
    if total < PROGRESS_MIN_BYTES or not sys.stderr.isatty():
        return None
    return Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                    TransferSpeedColumn(), transient=True)


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


def cmd_put(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    total = os.path.getsize(args.local)
    with connect(args) as fs, open(args.local, "rb") as src, fs.open(args.remote, "wb") as dst:
        n = _copy(src, dst, total, f"put {Path(args.local).name}")
    dt = time.perf_counter() - t0
    print(f"{args.local} -> {args.remote}: {human_bytes(n)} in {dt:.2f}s ({human_bytes(n / max(dt, 1e-9))}/s)",
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


def cmd_mv(args: argparse.Namespace) -> int:
    with connect(args) as fs:
        fs.rename(args.src, args.dst)
    return 0
