"""LoomFS errors survive pickling (torch.distributed passes one rank's error to the others
by pickling it; checkpoint review, session 15): class, errno, text, path and attributes."""

from __future__ import annotations

import errno
import pickle

import pytest

from loomfs.client.ec_io import FragmentUnavailable
from loomfs.errors import LoomError, NotFound, StatusError, TimedOut
from loomfs.wire.status import Status


@pytest.mark.parametrize("exc", [
    LoomError("boom"),
    LoomError("gone", errno=errno.ENOENT, path="/a/b"),
    NotFound(path="/x"),
    TimedOut("no answer in 30s"),
    StatusError(Status.ENOSPC, "full"),
    StatusError(Status.VERSION_MISMATCH),
])
def test_errors_round_trip_through_pickle(exc: LoomError) -> None:
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is type(exc)
    assert (back.errno, back.strerror, back.filename, back.status) == (exc.errno, exc.strerror, exc.filename,
                                                                        exc.status)
    assert str(back) == str(exc)
    assert isinstance(back, OSError)


def test_subclass_attributes_are_kept() -> None:
    exc = FragmentUnavailable("checksum mismatch")
    exc.corrupt = True
    back = pickle.loads(pickle.dumps(exc))
    assert isinstance(back, FragmentUnavailable) and back.corrupt and str(back) == str(exc)
