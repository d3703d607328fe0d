"""Extended attributes through the mount: ``user.loomfs.layout``, a virtual attribute that
reads a file's or directory's layout and, on a directory, sets the layout new files inherit
(JSON, the fields of ``loomfs.wire.types.Layout``). No I/O here.

Other ``user.*`` names are stored by meta (``loomfs.meta.ops.xattrs``); other namespaces
(``trusted.``, ``security.``, ``system.``) answer ENOTSUP, so ``cp -a``, ``tar`` and ``rsync -X``
carry user attributes and go on past the rest.
"""

from __future__ import annotations

import dataclasses
import errno
import json

from loomfs.wire.types import Layout

LAYOUT_XATTR = b"user.loomfs.layout"
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
