"""Extended attributes through the mount: ``user.loomfs.layout``, a virtual attribute that
reads a file's or directory's layout and, on a directory, sets the layout new files inherit
(JSON, the fields of ``loomfs.wire.types.Layout``), asked for by name only (``listxattr`` does
not list it, so tools copying attributes leave it alone); the create/replace flags of a
setxattr (``XattrProbes``). No I/O here.

Other ``user.*`` names are stored by meta (``loomfs.meta.ops.xattrs``); other namespaces
(``trusted.``, ``security.``, ``system.``) answer ENOTSUP, so ``cp -a``, ``tar`` and ``rsync -X``
carry user attributes and go on past the rest.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
from collections import OrderedDict
from typing import Any

from loomfs.wire.types import Layout

LAYOUT_XATTR = b"user.loomfs.layout"
PROBES_KEPT = 1024  # getxattr answers remembered (a setxattr's check is followed at once by it)
_SETTABLE = ("chunk_size", "stripe", "table_id", "replicas", "inline_max_bytes", "ec_k", "ec_m")


def encode_layout(layout: Layout | None) -> bytes:
    if layout is None:
        return b"{}"
    d = {f.name: getattr(layout, f.name) for f in dataclasses.fields(layout)}
    d["chains"] = list(layout.chains)
    return json.dumps(d, sort_keys=True).encode()


def decode_layout(value: bytes, current: Layout | None) -> Layout:
    """A layout from JSON: the given fields over ``current`` (a directory's chains stay
    empty). EINVAL for anything that is not an object of known integer fields."""
    try:
        d = json.loads(value.decode() or "{}")
    except (UnicodeDecodeError, ValueError) as exc:
        raise OSError(errno.EINVAL, f"layout is not JSON: {exc}") from exc
    if not isinstance(d, dict):
        raise OSError(errno.EINVAL, "layout must be a JSON object")
    d.pop("chains", None)  # a directory's are always empty; files' are meta's choice
    unknown = set(d) - set(_SETTABLE)
    if unknown:
        raise OSError(errno.EINVAL, f"unknown layout fields {sorted(unknown)}")
    if any(type(v) is not int for v in d.values()):
        raise OSError(errno.EINVAL, "layout fields are integers")
    base = dataclasses.replace(current, chains=[]) if current is not None else Layout()
    return dataclasses.replace(base, **d)


class XattrProbes:
    """Recovers a setxattr's ``XATTR_CREATE`` / ``XATTR_REPLACE`` flag, which pyfuse3 (3.x)
    does not pass: for a flagged setxattr it first calls ``getxattr`` with the same request
    context object, answers EEXIST / ENODATA itself when that check fails, and otherwise
    calls ``setxattr``. So a ``setxattr`` whose context had a ``getxattr`` of the same
    attribute before it was flagged, and that getxattr's outcome says which flag: absent ->
    XATTR_CREATE, present -> XATTR_REPLACE; with no getxattr it had no flag. Meta then
    applies the flag in the transaction that sets the value, so racing clients cannot both
    create. A plain getxattr request has a context of its own that no setxattr shares;
    its entry just ages out (at most ``PROBES_KEPT`` are kept, with their contexts, so an
    id is never reused while remembered)."""

    def __init__(self, kept: int = PROBES_KEPT) -> None:
        self.kept = kept
        self._seen: OrderedDict[int, tuple[Any, int, bytes, bool]] = OrderedDict()

    def seen(self, ctx: Any, inode: int, name: bytes, *, present: bool) -> None:
        if ctx is None:
            return
        self._seen[id(ctx)] = (ctx, inode, name, present)
        self._seen.move_to_end(id(ctx))
        while len(self._seen) > self.kept:
            self._seen.popitem(last=False)

    def flags_for(self, ctx: Any, inode: int, name: bytes) -> int:
        probe = self._seen.pop(id(ctx), None) if ctx is not None else None
        if probe is None or probe[0] is not ctx or probe[1:3] != (inode, name):
            return 0
        return os.XATTR_REPLACE if probe[3] else os.XATTR_CREATE

    def __len__(self) -> int:
        return len(self._seen)
