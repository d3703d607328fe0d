"""The blocking facade over fakes: file object behaviour, re-entry refusal, fork detection."""

from __future__ import annotations

import errno
import io
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_client_support import CHUNK, make_client

from loomfs.client.core import AsyncClient
from loomfs.client.sync import LOOP_THREAD_NAME, LoomFS, resolve_mgmtd


@pytest.fixture
def fs() -> Iterator[LoomFS]:
    made: list[Any] = []

    async def factory() -> AsyncClient:
        client, meta, storage = make_client()
        made.append((client, meta, storage))
        return client

    f = LoomFS("unused:1", client_factory=factory)
    f.made = made  # type: ignore[attr-defined]
    yield f
    f.close()


def test_file_object_is_a_real_buffered_io(fs: LoomFS, tmp_path: Path) -> None:
    data = os.urandom(3 * CHUNK + 17)
    with fs.open("/d.bin", "wb") as f:
        assert isinstance(f, io.BufferedIOBase)
        assert f.writable() and not f.readable() and f.seekable()
        assert f.write(data) == len(data)
        with pytest.raises(io.UnsupportedOperation):
            f.fileno()
    assert f.closed
    with pytest.raises(ValueError):
        f.write(b"x")
    assert fs.stat("/d.bin").st_size == len(data)
    with fs.open("/d.bin", "rb") as f:
        assert f.read(10) == data[:10]
        assert f.read1(5) == data[10:15]
        b = bytearray(100)
        assert f.readinto(b) == 100 and b == data[15:115]
        assert f.seek(-7, os.SEEK_END) == len(data) - 7 and f.tell() == len(data) - 7
        assert f.read() == data[-7:]
    assert fs.cat("/d.bin") == data
    src = tmp_path / "local.bin"
    src.write_bytes(data[::-1])
    fs.put(str(src), "/put.bin")
    fs.get("/put.bin", str(tmp_path / "back.bin"))
    assert (tmp_path / "back.bin").read_bytes() == data[::-1]


def test_text_mode_and_line_iteration(fs: LoomFS) -> None:
    with fs.open("/t.txt", "w") as f:
        f.write("héllo\nworld\n")
    with fs.open("/t.txt", "rb") as f:
        assert list(f) == ["héllo\n".encode(), b"world\n"]
    with fs.open("/t.txt", "r") as f:
        assert f.read() == "héllo\nworld\n"


def test_namespace_twins(fs: LoomFS) -> None:
    fs.makedirs("/a/b", exist_ok=True)
    fs.pipe("/a/b/f", b"123")
    assert fs.ls("/a") == ["/a/b"] and fs.exists("/a/b/f")
    assert list(fs.walk("/")) == [("/", ["a"], []), ("/a", ["b"], []), ("/a/b", [], ["f"])]
    fs.truncate("/a/b/f", 1)
    assert fs.cat("/a/b/f") == b"1"
    fs.rename("/a/b/f", "/a/g")
    fs.rmtree("/a")
    assert fs.ls("/") == []


def test_calls_from_the_loop_thread_are_refused(fs: LoomFS) -> None:
    out: list[BaseException | None] = []
    done = threading.Event()

    def from_loop() -> None:
        assert threading.current_thread().name == LOOP_THREAD_NAME
        try:
            fs.exists("/")
            out.append(None)
        except BaseException as exc:
            out.append(exc)
        done.set()

    fs.loop.call_soon_threadsafe(from_loop)
    assert done.wait(30)
    assert isinstance(out[0], RuntimeError) and "loomfs-io" in str(out[0])
    assert fs.exists("/")  # the facade still works from other threads


def test_pid_change_starts_a_fresh_loop_and_client(fs: LoomFS) -> None:
    f = fs.open("/x", "wb")
    old_loop, old_client = fs.loop, fs.client
    fs._pid = -2  # what a forked child sees: the pid no longer matches
    assert fs.exists("/") and len(fs.made) == 2  # type: ignore[attr-defined]
    assert fs.loop is not old_loop and fs.client is not old_client
    with pytest.raises(OSError) as e:
        f.write(b"x")  # opened before the "fork"
    assert e.value.errno == errno.EBADF
    old_loop.call_soon_threadsafe(old_loop.stop)


def test_resolve_mgmtd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_mgmtd("127.0.0.1:8000,127.0.0.1:8001") == "127.0.0.1:8000,127.0.0.1:8001"
    (tmp_path / "cluster.json").write_text(json.dumps({"mgmtd": "127.0.0.1:9123"}))
    assert resolve_mgmtd(str(tmp_path)) == "127.0.0.1:9123"
    monkeypatch.setenv("LOOMFS_CLUSTER", str(tmp_path))
    assert resolve_mgmtd(None) == "127.0.0.1:9123"
    monkeypatch.delenv("LOOMFS_CLUSTER")
    with pytest.raises(ValueError, match="LOOMFS_CLUSTER"):
        resolve_mgmtd(None)
    with pytest.raises(ValueError):
        resolve_mgmtd("not-an-address")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="cluster.json"):
        resolve_mgmtd(str(empty))
