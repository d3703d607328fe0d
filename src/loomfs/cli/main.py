"""``loomfs`` command line: one module per command group, this file only dispatches."""

from __future__ import annotations

import argparse
import os
import sys

from loomfs.cli import (
    admin,
    bench,
    ckpt,
    common,
    dashboard,
    demo,
    fs,
    layout,
    local,
    mount,
    pack,
    service,
    top,
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="loomfs",
        description="LoomFS: a distributed file system for AI training and inference.",
    )
    p.add_argument(
        "--dir", "-C", dest="cluster_dir", default=None,
        help="local cluster directory (default: $LOOMFS_CLUSTER, else ./loomfs-local)",
    )
    p.add_argument("--mgmtd", default=None, help="mgmtd address HOST:PORT (instead of --dir)")
    p.add_argument("--token-file", dest="token_file", default=None,
                   help="client token (default $LOOMFS_TOKEN_FILE, else the local cluster's admin.token; "
                        "docs/security.md)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for mod in (local, fs, admin, layout, demo, bench, top, dashboard, service, pack, mount, ckpt):
        mod.register(sub)
    _cluster_options_everywhere(p)
    return p


def _cluster_options_everywhere(parser: argparse.ArgumentParser) -> None:
    """``--dir``/``-C``, ``--mgmtd`` and ``--token-file`` also after the subcommand (``loomfs top --dir D``,
    ``loomfs admin targets --dir D``), as before it. A subcommand that has its own ``--dir``
    (``local up``) or ``--mgmtd`` (``mount``) keeps it. The copies default to SUPPRESS, so
    an option given before the subcommand is not overwritten by an absent one after it."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for child in set(action.choices.values()):
            have = set(child._option_string_actions)
            if "--dir" not in have and "-C" not in have:
                child.add_argument("--dir", "-C", dest="cluster_dir", default=argparse.SUPPRESS,
                                   help="local cluster directory (as before the command)")
            if "--mgmtd" not in have:
                child.add_argument("--mgmtd", dest="mgmtd", default=argparse.SUPPRESS,
                                   help="mgmtd address HOST:PORT (as before the command)")
            if "--token-file" not in have:
                child.add_argument("--token-file", dest="token_file", default=argparse.SUPPRESS,
                                   help="client token (as before the command)")
            _cluster_options_everywhere(child)


def describe(exc: OSError) -> str:
    """'PATH: No such file or directory (detail)' from any OSError."""
    std = os.strerror(exc.errno) if exc.errno else ""
    detail = exc.strerror or ""
    parts = [str(exc.filename)] if getattr(exc, "filename", None) else []
    text = std or detail or str(exc)
    if detail and detail != std and detail not in parts:
        text += f" ({detail})"
    parts.append(text)
    return ": ".join(parts)


def _quiet_stdout() -> None:
    """The reader of our stdout went away (``loomfs ... --json | head``): point stdout at
    /dev/null so the interpreter's final flush does not print 'Broken pipe' either."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    finally:
        os.close(devnull)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        common.use_token_file(getattr(args, "token_file", None))  # every command, target() or not
        rc = args.func(args)
        sys.stdout.flush()
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        _quiet_stdout()
        return 0
    except OSError as exc:
        print(f"loomfs {args.command}: {describe(exc)}", file=sys.stderr)
        return 1
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
