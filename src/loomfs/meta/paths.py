"""Path validation (pure). Client paths arrive absolute and normalised; check them again."""

from __future__ import annotations

from loomfs.errors import StatusError
from loomfs.wire.status import Status

NAME_MAX_BYTES = 255
PATH_MAX_BYTES = 4096
SYMLINK_MAX_BYTES = 4095


def _check_name(name: str, path: str) -> None:
    if len(name) > NAME_MAX_BYTES // 4 and len(name.encode("utf-8", "surrogatepass")) > NAME_MAX_BYTES:
        raise StatusError(Status.ENAMETOOLONG, f"component too long in {path!r}")


def split_path(path: str) -> list[str]:
    """``/a/b`` -> ``["a", "b"]``; ``/`` -> ``[]``. Raises ENOENT/EINVAL/ENAMETOOLONG."""
    if not path:
        raise StatusError(Status.ENOENT, "empty path")
    if "\x00" in path:
        raise StatusError(Status.EINVAL, "NUL byte in path")
    if path[0] != "/":
        raise StatusError(Status.EINVAL, f"path must be absolute: {path!r}")
    if len(path) > PATH_MAX_BYTES // 4 and len(path.encode("utf-8", "surrogatepass")) >= PATH_MAX_BYTES:
        raise StatusError(Status.ENAMETOOLONG, "path too long")
    if path == "/":
        return []
    parts = path[1:].split("/")
    for name in parts:
        if not name or name == "." or name == "..":
            raise StatusError(Status.EINVAL, f"path not normalised: {path!r}")
        if len(name) > NAME_MAX_BYTES // 4:  # (``_check_name``, inline: every request's path comes here)
            _check_name(name, path)
    return parts


def split_name(name: str) -> str:
    """Validate one entry name (no slash)."""
    if not name or "/" in name or name in (".", ".."):
        raise StatusError(Status.EINVAL, f"bad name {name!r}")
    if "\x00" in name:
        raise StatusError(Status.EINVAL, "NUL byte in name")
    _check_name(name, name)
    return name


def check_symlink_target(target: str) -> None:
    if not target:
        raise StatusError(Status.ENOENT, "empty symlink target")
    if "\x00" in target:
        raise StatusError(Status.EINVAL, "NUL byte in symlink target")
    if len(target.encode("utf-8", "surrogatepass")) > SYMLINK_MAX_BYTES:
        raise StatusError(Status.ENAMETOOLONG, "symlink target too long")


def split_target(target: str) -> tuple[bool, list[str], bool]:
    """A symlink target -> (absolute, components incl. '.'/'..', trailing slash)."""
    absolute = target.startswith("/")
    parts = [p for p in target.split("/") if p]
    return absolute, parts, target.endswith("/") and bool(parts)
