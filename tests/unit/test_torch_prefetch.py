"""``loomfs.torch.prefetch.Prefetcher`` with a fake store: errors are never dropped and no
``blocks`` call waits on a thread that has ended (fsspec/torch bug hunt, bug 3)."""

from __future__ import annotations

import io
import threading
from collections.abc import Callable
from typing import Any

import pytest

from loomfs.torch.prefetch import Prefetcher, Range

GUARD_S = 30.0  # how long a call may take before the test calls it hung


class FailingAfter(io.RawIOBase):
    """Answers ``n_ok`` reads, then EIO."""

    def __init__(self, n_ok: int):
        self.n_ok = n_ok
        self.reads = 0

    def readable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return 0

    def read(self, n: int = -1) -> bytes:
        self.reads += 1
        if self.reads > self.n_ok:
            raise OSError(5, "EIO")
        return b"x" * n


class Store:
    def __init__(self, ok_reads: dict[str, int]):
        self.ok_reads = ok_reads

    def open_read(self, path: str) -> FailingAfter:
        return FailingAfter(self.ok_reads.get(path, 1 << 30))

    def url(self, path: str) -> str:
        return f"fake://{path}"


def _outcome(fn: Callable[[], Any]) -> Any:
    """What ``fn`` returns or raises, run on a thread; fails the test if it hangs."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(GUARD_S)
    assert not t.is_alive(), "blocked on a prefetch thread that had ended"
    return out[0]


def test_error_in_the_dropped_rest_of_a_range_is_raised_by_the_next() -> None:
    pf = Prefetcher(Store({"a": 1}), [Range("a", 0, 8), Range("b", 0, 8)], block_bytes=4)  # type: ignore[arg-type]
    try:
        assert next(iter(pf.blocks(0))) == b"xxxx"  # a parser takes one block and stops
        got = _outcome(lambda: list(pf.blocks(1)))  # hung: the error for range 0 was skipped
        assert isinstance(got, OSError) and got.filename == "fake://a", got
    finally:
        pf.close()


def test_calls_after_the_thread_ended_raise() -> None:
    pf = Prefetcher(Store({"a": 0}), [Range("a"), Range("b"), Range("c")], block_bytes=4)  # type: ignore[arg-type]
    try:
        with pytest.raises(OSError):
            list(pf.blocks(0))
        got = _outcome(lambda: list(pf.blocks(1)))  # hung: nothing more would come
        assert isinstance(got, OSError) and got.filename == "fake://a", got
        got = _outcome(lambda: list(pf.blocks(2)))
        assert isinstance(got, OSError), got
        with pytest.raises(IndexError):
            next(pf.blocks(3))
    finally:
        pf.close()
