"""``loomfs mount MOUNTPOINT`` and ``loomfs umount MOUNTPOINT``: LoomFS as a directory.

    loomfs mount /mnt/loom                      # the cluster of -C/--mgmtd/$LOOMFS_CLUSTER
    loomfs --mgmtd 10.0.0.1:8000 mount /mnt/loom -o attr_timeout=2,allow_other
    loomfs mount /mnt/loom --foreground         # stays attached; Ctrl-C unmounts
    loomfs umount /mnt/loom
"""

from __future__ import annotations

import argparse
import logging

from loomfs.cli.common import target


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("mount", help="mount LoomFS at a directory (FUSE)")
    p.add_argument("mountpoint", metavar="MOUNTPOINT")
    p.add_argument("--dir", dest="mount_dir", default=None, help="local cluster directory (like -C)")
    p.add_argument("--mgmtd", dest="mount_mgmtd", default=None, help="mgmtd address HOST:PORT")
    p.add_argument("-o", dest="options", action="append", default=[], metavar="OPT[,OPT...]",
                   help="attr_timeout=S, entry_timeout=S, negative_timeout=S, loop=shared|separate, "
                        "max_tasks=N, read_ahead_kb=N, readdir_page=N, consistency=strict|relaxed, "
                        "cache=auto|keep|none, direct_io, ro, uid_map=L:C/..., gid_map=L:C/..., "
                        "no_default_permissions; others (allow_other, ...) go to FUSE (docs/mount.md)")
    p.add_argument("--foreground", "-f", action="store_true", help="stay attached (Ctrl-C unmounts)")
    p.add_argument("--pid-file", default=None, help=argparse.SUPPRESS)
    p.add_argument("--debug", action="store_true", help="log every request")
    p.set_defaults(func=cmd_mount)

    p = sub.add_parser("umount", help="unmount a LoomFS mount and stop its daemon")
    p.add_argument("mountpoint", metavar="MOUNTPOINT")
    p.add_argument("--lazy", "-z", action="store_true", help="detach now even if busy")
    p.set_defaults(func=cmd_umount)


def _target(args: argparse.Namespace) -> str:
    if args.mount_mgmtd:
        args.mgmtd = args.mount_mgmtd
    if args.mount_dir:
        args.cluster_dir = args.mount_dir
    return target(args)


def cmd_mount(args: argparse.Namespace) -> int:
    from loomfs.mount import daemon
    from loomfs.mount.options import MountOptions

    where = _target(args)
    options = MountOptions.parse(args.options)
    daemon.clear_stale(args.mountpoint)
    if not args.foreground:
        argv = ["--mgmtd" if args.mgmtd else "--dir", where, "mount", args.mountpoint]
        for o in args.options:
            argv += ["-o", o]
        if args.debug:
            argv.append("--debug")
        pid = daemon.start_background(argv, args.mountpoint)
        _, log = daemon.state_files(args.mountpoint)
        print(f"mounted {where} at {args.mountpoint} (pid {pid}, log {log})")
        return 0
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    daemon.serve(where, args.mountpoint, options, pid_file=args.pid_file)
    return 0


def cmd_umount(args: argparse.Namespace) -> int:
    from loomfs.mount import daemon

    daemon.umount(args.mountpoint, lazy=args.lazy)
    return 0
