from __future__ import annotations

import errno
import posixpath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loomfs.client.paths import join, normalize, split
from loomfs.errors import InvalidArgument, NameTooLong, NotFound


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("/", "/"),
        ("/a/b", "/a/b"),
        ("a/b", "/a/b"),
        ("//a///b//", "/a/b"),
        ("/a/./b/.", "/a/b"),
        ("/a/b/../c", "/a/c"),
        ("/../x", "/x"),
        ("/../../..", "/"),
        ("/a/../../b", "/b"),
        ("..", "/"),
        (".", "/"),
        ("/a/b/..", "/a"),
        ("/ü/名", "/ü/名"),
    ],
)
def test_normalize(raw: str, want: str) -> None:
    assert normalize(raw) == want


def test_bad_paths_raise_the_right_errno() -> None:
    with pytest.raises(NotFound) as e1:
        normalize("")
    assert e1.value.errno == errno.ENOENT
    with pytest.raises(InvalidArgument) as e2:
        normalize("/a\0b")
    assert e2.value.errno == errno.EINVAL
    with pytest.raises(NameTooLong) as e3:
        normalize("/" + "x" * 256)
    assert e3.value.errno == errno.ENAMETOOLONG
    assert normalize("/" + "x" * 255) == "/" + "x" * 255
    with pytest.raises(NameTooLong):
        normalize("/" + "é" * 128)  # 256 UTF-8 bytes


@given(st.lists(st.sampled_from(["a", "b", ".", "..", "", "c d"]), max_size=12))
def test_never_escapes_root_and_matches_posix_normpath(parts: list[str]) -> None:
    raw = "/" + "/".join(parts)
    got = normalize(raw)
    assert got.startswith("/") and "//" not in got
    assert ".." not in got.split("/") and "." not in got.split("/")
    want = posixpath.normpath(raw)
    want = "/" + want.lstrip("/")  # normpath keeps a leading '//'
    assert got == want
    assert normalize(got) == got  # idempotent


def test_join_and_split() -> None:
    assert join("/", "a") == "/a"
    assert join("/a", "b") == "/a/b"
    assert split("/a/b") == ("/a", "b")
    assert split("/a") == ("/", "a")
    assert split("/") == ("/", "")
