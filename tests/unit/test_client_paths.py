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


def test_names_that_are_not_utf8_are_einval_not_unicode_errors() -> None:
    import os

    raw = os.fsdecode(b"/data/caf\xe9.jpg")  # Latin-1 bytes: a lone surrogate in the str
    with pytest.raises(InvalidArgument) as e:
        normalize(raw)
    assert e.value.errno == errno.EINVAL and isinstance(e.value, OSError)
    assert "UTF-8" in str(e.value)
    assert normalize(os.fsdecode("/data/café.jpg".encode())) == "/data/café.jpg"


def test_relative_paths_resolve_against_the_root_the_documented_working_directory() -> None:
    import loomfs.client.paths as paths_mod

    assert "working directory" in (paths_mod.__doc__ or "")
    assert normalize("a/b") == normalize("/a/b") == "/a/b"


class _PathLike:
    def __init__(self, text: str):
        self.text = text

    def __fspath__(self) -> str:
        return self.text


def _outcome(raw: object) -> tuple[str, object]:
    try:
        return "ok", normalize(raw)  # type: ignore[arg-type]
    except OSError as exc:
        return "error", exc.errno


@given(st.lists(st.sampled_from(["a", "b", "", ".", "..", "\0", "é", "\udcff", "x" * 200, ".hidden", "c" * 60]),
                max_size=6), st.booleans())
def test_the_already_normal_shortcut_answers_as_the_full_path(parts: list[str], absolute: bool) -> None:
    """A str takes the shortcut when it looks normal; a PathLike always takes the full walk."""
    raw = ("/" if absolute else "") + "/".join(parts)
    assert _outcome(raw) == _outcome(_PathLike(raw))
