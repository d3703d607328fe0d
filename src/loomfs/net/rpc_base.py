"""What both sides of the RPC layer share: the handler context, replies, observers, errors."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from loomfs.common.identity import TRUSTED, Identity
from loomfs.errors import (
    LoomError,
    PermissionDenied,
    from_status,
)
from loomfs.wire.message import Message, Method
from loomfs.wire.status import AUTH_STATUSES, status_of

logger = logging.getLogger("loomfs.net.rpc")

M = TypeVar("M", bound=Message)

_EMPTY = memoryview(b"")
AUTH_CLOSE_DELAY_S = 1.0  # a peer refused for its credentials is closed this long after the answer


def remote_error(code: int, message: str) -> LoomError:
    """The exception for a non-OK reply; refused credentials are EACCES (PermissionError)."""
    status = status_of(code)
    if status in AUTH_STATUSES:
        exc: LoomError = PermissionDenied(f"{status.name}: {message}")
        exc.status = status
        return exc
    return from_status(code, message)


@dataclass(slots=True)
class CallContext:
    """What a handler gets besides the decoded request."""

    payload: memoryview
    request_id: int
    peer: str
    deadline: float | None  # loop.time() by which the reply is due; None = no deadline
    payload_crc: int = 0  # CRC32C of ``payload``, already verified by the framing layer
    # who the connection authenticated as (``loomfs.common.identity``); TRUSTED without auth
    identity: Identity = TRUSTED


@dataclass(slots=True)
class Reply:
    """A handler's answer when it has a payload to send."""

    body: Message
    payload: bytes | bytearray | memoryview | None = None
    payload_crc: int | None = None  # precomputed (e.g. the stored chunk CRC)
    on_sent: Callable[[], None] | None = None  # e.g. give a pooled buffer back


Handler = Callable[[Any, CallContext], Awaitable[Message | Reply]]


class RpcObserver(Protocol):
    """Told about every finished call (metrics). ``side`` is "server" or "client";
    ``method`` the method's name ("stat", "write", ... or "unknown")."""

    def on_call(
        self, side: str, method: str, status: int, seconds: float, bytes_in: int, bytes_out: int
    ) -> None: ...


def handles(m: Method) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a service coroutine as the handler of ``m``: ``@handles(STAT)``."""

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn.__loomfs_method__ = m  # type: ignore[attr-defined]
        return fn

    return mark
