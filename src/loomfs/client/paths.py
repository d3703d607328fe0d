"""Path normalisation: every path the client sends is absolute, '/'-separated and lexical.

``.`` and ``..`` are resolved without looking at the namespace (like ``os.path.normpath``),
``..`` at the root stays at the root, duplicate slashes go away.

Working directory: a LoomFS client has none of its own (no ``chdir``); its working directory
is always the root, so a relative path ``a/b`` means ``/a/b`` — in the blocking API, the
async core, fsspec (``loom://a/b``) and the CLI alike.

Names are UTF-8 text. A name that is not (a ``str`` holding lone surrogates, which is what
``os.fsdecode`` makes of undecodable bytes) is refused with EINVAL, never sent.
"""

from __future__ import annotations

import os

from loomfs.errors import InvalidArgument, NameTooLong, NotFound

NAME_BYTES_MAX = 255


def normalize(path: str | os.PathLike[str]) -> str:
    """``'a//b/./c/../d'`` -> ``'/a/b/d'``; raises ENOENT / EINVAL / ENAMETOOLONG."""
    if type(path) is str and path.isascii() and len(path) <= NAME_BYTES_MAX + 1 and path[:1] == "/" \
            and path[-1] != "/" and "//" not in path and "/." not in path and "\0" not in path:
        return path  # already normal (no empty, "." or ".." component; ASCII, so UTF-8, and no
        # component can be over the limit): every call of the blocking API passes here
    text = os.fspath(path)
    if not isinstance(text, str):
        raise InvalidArgument(f"path must be str, got {type(text).__name__}")
    if not text:
        raise NotFound("empty path", path=text)
    if "\0" in text:
        raise InvalidArgument("path contains a NUL byte", path=text)
    check_utf8(text, "path")
    parts: list[str] = []
    for comp in text.split("/"):
        if comp in ("", "."):
            continue
        if comp == "..":
            if parts:
                parts.pop()
            continue
        if len(comp.encode("utf-8", "surrogateescape")) > NAME_BYTES_MAX:
            raise NameTooLong(f"path component longer than {NAME_BYTES_MAX} bytes", path=text)
        parts.append(comp)
    return "/" + "/".join(parts)


def check_utf8(text: str, what: str = "name") -> str:
    """``text`` if it encodes as UTF-8; EINVAL for lone surrogates (``os.fsdecode`` of bytes
    that are not UTF-8), which LoomFS does not store."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgument(f"{what} is not valid UTF-8 (undecodable byte at {exc.start}); "
                              f"LoomFS names are UTF-8 text", path=text) from None
    return text


def join(parent: str, name: str) -> str:
    """Join a normalised directory path and one entry name."""
    return parent + name if parent.endswith("/") else f"{parent}/{name}"


def split(path: str) -> tuple[str, str]:
    """Normalised ``'/a/b'`` -> ``('/a', 'b')``; ``'/'`` -> ``('/', '')``."""
    head, _, tail = path.rpartition("/")
    return (head or "/"), tail
