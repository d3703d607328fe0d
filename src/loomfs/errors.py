"""The LoomFS exception tree.

Every error a user sees is an ``OSError`` subclass with the matching ``errno`` (so
``except FileNotFoundError`` works), and also a ``LoomError`` (so ``except LoomError`` catches
everything from LoomFS). RPC carries status codes, never pickled exceptions; ``from_status``
turns a code back into the right exception at the client edge.
"""

from __future__ import annotations

import errno as _errno
import os

from loomfs.wire.status import Status


class LoomError(OSError):
    """Base of all LoomFS errors."""

    default_errno = _errno.EIO

    def __init__(self, message: str = "", *, errno: int | None = None, path: str | None = None):
        code = self.default_errno if errno is None else errno
        if path is not None:
            super().__init__(code, message or os.strerror(code), path)
        else:
            super().__init__(code, message or os.strerror(code))
        self.status: Status | None = None

    def __reduce__(self) -> tuple[object, ...]:
        """Pickled as its class, errno, text, path and attributes (every subclass, whatever
        its constructor takes): torch.distributed hands one rank's error to the others by
        pickling it, and the keyword-only constructor could not be called back."""
        return _rebuild, (type(self), self.errno, self.strerror, self.filename), dict(self.__dict__)


def _rebuild(cls: type[LoomError], code: int | None, text: str | None, path: str | None) -> LoomError:
    exc = cls.__new__(cls)
    if path is not None:
        OSError.__init__(exc, code, text, path)
    else:
        OSError.__init__(exc, code, text)
    exc.status = None
    return exc


class NotFound(LoomError, FileNotFoundError):
    default_errno = _errno.ENOENT


class AlreadyExists(LoomError, FileExistsError):
    default_errno = _errno.EEXIST


class NotADirectory(LoomError, NotADirectoryError):
    default_errno = _errno.ENOTDIR


class IsADirectory(LoomError, IsADirectoryError):
    default_errno = _errno.EISDIR


class DirectoryNotEmpty(LoomError):
    default_errno = _errno.ENOTEMPTY


class PermissionDenied(LoomError, PermissionError):
    default_errno = _errno.EACCES


class InvalidArgument(LoomError, ValueError):
    default_errno = _errno.EINVAL


class NameTooLong(LoomError):
    default_errno = _errno.ENAMETOOLONG


class NoSpace(LoomError):
    default_errno = _errno.ENOSPC


class ReadOnly(LoomError):
    default_errno = _errno.EROFS


class TooManyLinks(LoomError):
    default_errno = _errno.ELOOP


class CrossDevice(LoomError):
    default_errno = _errno.EXDEV


class Busy(LoomError, BlockingIOError):
    default_errno = _errno.EBUSY


class TimedOut(LoomError, TimeoutError):
    default_errno = _errno.ETIMEDOUT


class ConnectionFailed(LoomError, ConnectionError):
    """A peer could not be reached or the connection broke mid-call."""

    default_errno = _errno.ECONNREFUSED


class ConnectRefused(ConnectionFailed):
    """Nothing listens at the address: the request was never sent, so any call may retry."""


class ChecksumError(LoomError):
    """Data failed its CRC32C check."""

    default_errno = _errno.EIO


class ProtocolError(LoomError):
    """A peer sent something that is not a valid LoomFS frame or message."""

    default_errno = _errno.EPROTO


class RemoteError(LoomError):
    """A protocol status (code >= 1000) the caller did not handle itself."""

    default_errno = _errno.EIO


_BY_ERRNO: dict[int, type[LoomError]] = {
    _errno.ENOENT: NotFound,
    _errno.EEXIST: AlreadyExists,
    _errno.ENOTDIR: NotADirectory,
    _errno.EISDIR: IsADirectory,
    _errno.ENOTEMPTY: DirectoryNotEmpty,
    _errno.EACCES: PermissionDenied,
    _errno.EPERM: PermissionDenied,
    _errno.EINVAL: InvalidArgument,
    _errno.ENAMETOOLONG: NameTooLong,
    _errno.ENOSPC: NoSpace,
    _errno.EROFS: ReadOnly,
    _errno.ELOOP: TooManyLinks,
    _errno.EXDEV: CrossDevice,
    _errno.EBUSY: Busy,
    _errno.ETIMEDOUT: TimedOut,
}


def error_for_errno(code: int, message: str = "", path: str | None = None) -> LoomError:
    cls = _BY_ERRNO.get(code, LoomError)
    return cls(message, errno=code, path=path)


def from_status(code: int, message: str = "", path: str | None = None) -> LoomError:
    """Build the exception for a non-OK wire status."""
    try:
        status = Status(code)
    except ValueError:
        status = Status.INTERNAL
    if status.is_errno:
        exc = error_for_errno(status.value, message, path)
    elif status is Status.CHECKSUM_MISMATCH:
        exc = ChecksumError(message or "checksum mismatch", path=path)
    elif status is Status.DEADLINE_EXCEEDED:
        exc = TimedOut(message or "deadline exceeded", path=path)
    else:
        exc = RemoteError(f"{status.name}: {message}" if message else status.name, path=path)
    exc.status = status
    return exc


def status_for_exception(exc: BaseException) -> Status:
    """The wire status a server sends for an exception raised by its logic."""
    if isinstance(exc, LoomError) and exc.status is not None:
        return exc.status
    if isinstance(exc, OSError) and exc.errno is not None:
        try:
            st = Status(exc.errno)
        except ValueError:
            return Status.EIO
        return st
    return Status.INTERNAL


class StatusError(LoomError):
    """Raised by server logic to send a specific protocol status."""

    def __init__(self, status: Status, message: str = ""):
        super().__init__(message or status.name, errno=status.value if status.is_errno else _errno.EIO)
        self.status = status
