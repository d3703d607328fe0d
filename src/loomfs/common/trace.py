"""Trace ids: one id follows a request across services and shows on every log line.

The id rides in the frame header (8th item), lives in a ``ContextVar`` while a handler runs,
and is sent again on any call that handler makes (a storage forward, a meta GC removal), so
``grep <id>`` over all service logs shows one request's whole path.
"""

from __future__ import annotations

import logging
import random
from contextvars import ContextVar

TRACE: ContextVar[int] = ContextVar("loomfs_trace", default=0)
_rng = random.Random()


def current() -> int:
    return TRACE.get()


def new_id() -> int:
    return _rng.getrandbits(63) or 1


def outgoing() -> int:
    """The id for a call being sent: the current request's, else a fresh one."""
    return TRACE.get() or new_id()


class TraceFilter(logging.Filter):
    """Adds ``%(trace)s`` to every record: the current trace id in hex, or '-'."""

    def filter(self, record: logging.LogRecord) -> bool:
        t = TRACE.get()
        record.trace = f"{t:016x}" if t else "-"
        return True
