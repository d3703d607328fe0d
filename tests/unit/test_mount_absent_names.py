"""The mount's names known absent (``loomfs.mount.names``): answered only within the TTL from
when meta was asked, never for a name made or being made through the mount, never from an
answer that raced a change of names (no FUSE, no sockets)."""

from __future__ import annotations

import asyncio
import errno

import pyfuse3
import pytest

from loomfs.mount.names import MAX_MISSES, RELIST_MIN_ANSWERS, AbsentNames
from loomfs.mount.ops import LoomOperations
from loomfs.mount.options import MountOptions
from loomfs.wire.types import Attr, FileType


def test_listing_answers_within_the_ttl_only() -> None:
    a = AbsentNames(1.0)
    a.listed(5, ["x"], asked=100.0, token=a.begin_listing(5))
    assert a.absent(5, "y", now=100.5) and not a.absent(5, "x", now=100.5)
    assert not a.absent(6, "y", now=100.5)  # another directory: unknown
    assert not a.absent(5, "y", now=101.0)  # the TTL counts from when meta was asked
    assert not a.absent(5, "y", now=100.5)  # and an expired listing is gone


def test_misses_and_adding() -> None:
    a = AbsentNames(1.0)
    a.missed(5, "n", asked=10.0, epoch=a.epoch)
    assert a.absent(5, "n", now=10.2)
    a.adding(5, "n")  # a create of it starts here
    assert not a.absent(5, "n", now=10.3)
    a.listed(7, [], asked=10.0, token=set())
    a.adding(7, "m")
    assert not a.absent(7, "m", now=10.1) and a.absent(7, "other", now=10.1)
    a.removed(7, "m")  # unlinked here: absent again
    assert a.absent(7, "m", now=10.1)


def test_an_answer_that_raced_a_change_is_not_kept() -> None:
    a = AbsentNames(1.0)
    epoch = a.epoch
    token = a.begin_listing(5)
    a.adding(5, "n")  # e.g. a create through the mount while meta answered a LOOKUP / listed
    a.missed(5, "n", asked=10.0, epoch=epoch)
    a.listed(5, [], asked=10.0, token=token)  # meta's listing came before the create committed
    assert not a.absent(5, "n", now=10.1) and a.absent(5, "m", now=10.1)
    abandoned = a.begin_listing(6)
    a.abandon(6, abandoned)
    a.adding(6, "x")
    assert not abandoned and not a._inflight


def test_a_listing_that_answered_is_read_again_once_expired() -> None:
    a = AbsentNames(1.0)
    a.listed(5, [], asked=10.0, token=set())
    a.listed(6, [], asked=10.0, token=set())
    for i in range(RELIST_MIN_ANSWERS):
        assert a.absent(5, f"n{i}", now=10.5)
    assert not a.wants_relist(5, now=10.6)  # still fresh
    assert a.wants_relist(5, now=11.5) and not a.wants_relist(5, now=11.5)  # once
    assert not a.wants_relist(6, now=11.5)  # answered nothing: not worth a READDIR
    assert not a.absent(5, "n0", now=11.5)


def test_disabled_and_bounded() -> None:
    off = AbsentNames(0.0)
    off.listed(5, [], asked=0.0, token=set())
    off.missed(5, "n", asked=0.0, epoch=off.epoch)
    assert not off.absent(5, "n", now=0.0)
    a = AbsentNames(100.0)
    for i in range(MAX_MISSES + 10):
        a.missed(5, f"n{i}", asked=1.0, epoch=a.epoch)
    assert not a.absent(5, "n0", now=2.0) and a.absent(5, f"n{MAX_MISSES + 9}", now=2.0)
    a.listed(9, [], asked=1.0, token=set())
    a.forget(9)
    assert not a.absent(9, "z", now=2.0)


class _Client:
    """lstat answers ENOENT for names not in ``files``; counts the calls."""

    def __init__(self) -> None:
        self.files: dict[str, Attr] = {}
        self.lstats = 0

    async def lstat(self, path: str) -> Attr:
        self.lstats += 1
        if path not in self.files:
            raise FileNotFoundError(errno.ENOENT, "no", path)
        return self.files[path]


@pytest.fixture
def ops() -> LoomOperations:
    client = _Client()
    o = LoomOperations(client, None, MountOptions.parse(["absent_timeout=60"]))  # type: ignore[arg-type]
    o.call = lambda coro: coro  # type: ignore[method-assign,assignment,return-value]
    return o


def test_lookup_asks_meta_once_then_answers_the_miss(ops: LoomOperations) -> None:
    client = ops.client
    assert isinstance(client, _Client)

    async def go() -> None:
        for _ in range(3):
            with pytest.raises(pyfuse3.FUSEError) as e:
                await ops.lookup(1, b"nope")
            assert e.value.errno == errno.ENOENT
        assert client.lstats == 1 and ops.stats.requests["lookup_absent_cached"] == 2
        ops.absent.adding(1, "nope")  # a create through the mount: meta is asked again
        client.files["/nope"] = Attr(inode=42, type=int(FileType.FILE), nlink=1)
        assert (await ops.lookup(1, b"nope")).st_ino == 42
        assert client.lstats == 2

    asyncio.run(go())


def test_lookup_with_absence_off_always_asks(ops: LoomOperations) -> None:
    ops.absent = AbsentNames(0.0)
    client = ops.client
    assert isinstance(client, _Client)

    async def go() -> None:
        for _ in range(2):
            with pytest.raises(pyfuse3.FUSEError):
                await ops.lookup(1, b"nope")
        assert client.lstats == 2

    asyncio.run(go())


def test_absent_timeout_default_follows_the_consistency_mode() -> None:
    assert MountOptions().absent_ttl_s == 0.0  # strict: the next call sees another client's name
    assert MountOptions.parse([]).absent_ttl_s == 0.0
    assert MountOptions.parse(["consistency=relaxed"]).absent_ttl_s == 1.0  # = entry_timeout
    assert MountOptions.parse(["consistency=relaxed,entry_timeout=5"]).absent_ttl_s == 5.0
    assert MountOptions.parse(["absent_timeout=2"]).absent_ttl_s == 2.0  # given: kept
    assert MountOptions.parse(["consistency=relaxed,absent_timeout=0"]).absent_ttl_s == 0.0
