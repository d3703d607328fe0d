"""What every handler of the mount shares: errors to ``FUSEError`` at this edge, names to
paths, and the open-file handle."""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import os
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

import pyfuse3

from loomfs.client.file import AsyncFile
from loomfs.mount.prefetch import Prefetcher

logger = logging.getLogger(__name__)
T = TypeVar("T")
P = ParamSpec("P")


def fuse_errors(fn: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Coroutine[Any, Any, T]]:
    name = fn.__name__

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kw: P.kwargs) -> T:
        stats = getattr(args[0], "stats", None)  # LoomOperations's MountStats
        if stats is not None:
            stats.requests[name] += 1
        try:
            return await fn(*args, **kw)
        except pyfuse3.FUSEError:
            raise
        except OSError as exc:
            logger.debug("%s%r: %s", fn.__name__, args[1:], exc)
            raise pyfuse3.FUSEError(exc.errno or errno.EIO) from exc
        except ValueError as exc:
            raise pyfuse3.FUSEError(errno.EINVAL) from exc
        except Exception as exc:  # a bug: EIO for this request; pyfuse3 would stop serving (and the
            # kernel would wait for an answer forever) if it saw any other exception
            logger.exception("%s%r failed", fn.__name__, args[1:])
            raise pyfuse3.FUSEError(errno.EIO) from exc
    return wrapper


def join(parent: str, name: bytes) -> str:
    n = os.fsdecode(name)
    if "/" in n or n in ("", ".", ".."):
        raise OSError(errno.EINVAL, "bad name", n)
    return f"/{n}" if parent == "/" else f"{parent}/{n}"


@dataclass(eq=False)
class Handle:
    """One open file: the client's file object and what the kernel opened it as."""

    inode: int
    file: AsyncFile
    writable: bool
    append: bool = False  # O_APPEND: every write goes to the end this mount knows
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # utimens while open for writing (cp -a, tar x): meta stamps mtime at sync and close,
    # so the times are set again after those
    times_ns: tuple[int, int] | None = None
    prefetch: Prefetcher | None = None  # read-only handles: sequential read-ahead (loomfs.mount.prefetch)
    hold_id: int = 0  # read-only handles of files in chunks: the read hold at meta (loomfs.mount.holds)
    lost: bool = False  # its hold lapsed and could not be taken again: reads answer EIO
    error: BaseException | None = None  # a write error met by a getattr: its next fsync or close(2) raises it

