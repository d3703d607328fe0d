"""LoomFS: a distributed file system for AI training and inference.

``fs = loomfs.connect("127.0.0.1:8000")`` (or a local cluster directory, or
``$LOOMFS_CLUSTER``) returns a blocking ``LoomFS``; ``fs.open(path, "rb")`` gives a normal
binary file object.
"""

from typing import TYPE_CHECKING, Any

from loomfs.errors import (
    AlreadyExists,
    Busy,
    ChecksumError,
    ConnectionFailed,
    CrossDevice,
    DirectoryNotEmpty,
    InvalidArgument,
    IsADirectory,
    LoomError,
    NameTooLong,
    NoSpace,
    NotADirectory,
    NotFound,
    PermissionDenied,
    ReadOnly,
    TimedOut,
)

if TYPE_CHECKING:
    from loomfs.client.sync import LoomFS, connect

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # the client (and its network stack) loads on first use, so services importing
    # loomfs.errors or loomfs.wire do not pay for it
    if name in ("LoomFS", "connect"):
        from loomfs.client import sync

        return getattr(sync, name)
    raise AttributeError(f"module 'loomfs' has no attribute {name!r}")

__all__ = [
    "AlreadyExists",
    "Busy",
    "ChecksumError",
    "ConnectionFailed",
    "CrossDevice",
    "DirectoryNotEmpty",
    "InvalidArgument",
    "IsADirectory",
    "LoomError",
    "LoomFS",
    "NameTooLong",
    "NoSpace",
    "NotADirectory",
    "NotFound",
    "PermissionDenied",
    "ReadOnly",
    "TimedOut",
    "connect",
]
