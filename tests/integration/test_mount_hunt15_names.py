"""Two mounts of one cluster: names another mount changed reach this one's kernel and its
inode table within the revalidation window (entry/attr timeouts, 1 s by default).

The mount's inode table is path-based: the kernel asks by inode, the mount asks meta by a
name it learned. A name another client renamed or unlinked must not stay the one used for an
inode that still has a valid name here (a directory renamed elsewhere, the other hard link)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from test_mount_locks import two  # noqa: F401 - two: the module's fixture of two mounts (default options)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
WINDOW_S = 15.0  # the revalidation window is 1 s; slack for a loaded machine


@pytest.fixture()
def where(two: tuple[str, str], request: pytest.FixtureRequest) -> tuple[Path, Path]:  # noqa: F811
    """(a fresh directory through mount a, the same directory through mount b)."""
    name = f"{request.node.name}-{os.getpid()}-{time.monotonic_ns()}"
    (Path(two[0]) / name).mkdir()
    return Path(two[0]) / name, Path(two[1]) / name


def eventually(what: str, fn: Callable[[], object], timeout_s: float = WINDOW_S) -> object:
    """``fn()``'s value once it stops raising (OSError, AssertionError); the last error after
    the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return fn()
        except (OSError, AssertionError) as exc:
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: still {exc!r} after {timeout_s} s") from exc
        time.sleep(0.05)


def test_a_directory_renamed_by_the_other_mount(where: tuple[Path, Path]) -> None:
    a, b = where
    (a / "d").mkdir()
    (a / "d" / "f").write_bytes(b"payload")
    (a / "d" / "sub").mkdir()
    (a / "d" / "sub" / "g").write_bytes(b"deeper")
    assert (a / "d" / "f").read_bytes() == b"payload"  # mount a's kernel and table know them
    assert (a / "d" / "sub" / "g").read_bytes() == b"deeper"
    assert (b / "d" / "f").read_bytes() == b"payload"
    os.rename(b / "d", b / "e")
    assert eventually("the file under the new name", lambda: (a / "e" / "f").read_bytes()) == b"payload"
    assert (a / "e" / "sub" / "g").read_bytes() == b"deeper"
    assert sorted(os.listdir(a / "e")) == ["f", "sub"]
    (a / "e" / "new").write_bytes(b"made through a")  # a create under the renamed directory
    assert eventually("a's create seen by b", lambda: (b / "e" / "new").read_bytes()) == b"made through a"
    os.rename(a / "e" / "f", a / "e" / "f2")
    assert eventually("a's rename seen by b", lambda: (b / "e" / "f2").read_bytes()) == b"payload"
    assert not (a / "d").exists()


def test_the_other_hard_link_after_an_unlink_elsewhere(where: tuple[Path, Path]) -> None:
    a, b = where
    (a / "x").write_bytes(b"linked")
    os.link(a / "x", a / "y")
    assert (a / "x").read_bytes() == b"linked" and (a / "y").read_bytes() == b"linked"
    assert os.stat(a / "x").st_nlink == 2
    os.unlink(b / "x")

    def through_y() -> bytes:
        assert os.stat(a / "y").st_nlink == 1
        with open(a / "y", "r+b") as f:
            data = f.read()
            f.seek(0, os.SEEK_END)
            f.write(b"+")
        return data
    assert eventually("the other link", through_y) == b"linked"
    assert (b / "y").read_bytes() == b"linked+"
    assert not (a / "x").exists()


def test_a_file_renamed_by_the_other_mount_opens_under_its_new_name(where: tuple[Path, Path]) -> None:
    a, b = where
    (a / "old").write_bytes(b"moved")
    assert (a / "old").read_bytes() == b"moved"
    os.rename(b / "old", b / "new")
    assert eventually("the new name", lambda: (a / "new").read_bytes()) == b"moved"
    with open(a / "new", "ab") as f:
        f.write(b"!")
    assert eventually("a's append seen by b", lambda: (b / "new").read_bytes()) == b"moved!"


def test_a_directory_renamed_elsewhere_and_met_in_a_listing(where: tuple[Path, Path]) -> None:
    """The new name reaches the kernel by a READDIRPLUS entry of the parent, not a LOOKUP."""
    a, b = where
    (a / "d").mkdir()
    (a / "d" / "f").write_bytes(b"listed")
    assert os.listdir(a / "d") == ["f"] and (a / "d" / "f").read_bytes() == b"listed"
    os.rename(b / "d", b / "e")

    def listed() -> list[str]:
        names = os.listdir(a)  # READDIRPLUS: the kernel learns "e" from the entry
        assert "e" in names and "d" not in names, names
        return os.listdir(a / "e")
    assert eventually("the renamed directory listed", listed) == ["f"]
    assert (a / "e" / "f").read_bytes() == b"listed"
