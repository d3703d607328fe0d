"""The blocking API's caller-thread metadata path agrees with the async path and falls back."""

from __future__ import annotations

import threading

import pytest

import loomfs
from loomfs.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_fast_stat_matches_and_raises_errno(fs: loomfs.LoomFS, base: str) -> None:
    fs.pipe(f"{base}/f", b"12345")
    fs.symlink(f"{base}/f", f"{base}/l")
    fs.stat(base)  # the first call may go the async way (picks the meta server)
    fast = fs._fast
    assert fast is not None
    before, fell_back = fast.calls, fast.fallbacks
    st = fs.stat(f"{base}/l")
    assert st.st_size == 5
    slow = fs.run(fs.client.stat(f"{base}/l"))
    assert st.st_ino == slow.inode and st.st_size == slow.size
    with pytest.raises(FileNotFoundError):
        fs.stat(f"{base}/missing")
    with pytest.raises(NotADirectoryError):
        fs.stat(f"{base}/f/x")
    assert fs.exists(f"{base}/f") and not fs.exists(f"{base}/nope")
    assert fast.calls >= before + 5  # all of those went the fast way
    assert fast.fallbacks == fell_back  # answered there (authenticated as the async path is)

    errors: list[BaseException] = []

    def worker() -> None:  # a socket per thread, no sharing
        try:
            for _ in range(200):
                assert fs.stat(f"{base}/f").st_size == 5
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_fast_path_falls_back_when_meta_restarts(own_cluster: LocalCluster) -> None:
    fs = loomfs.connect(str(own_cluster.root))
    try:
        fs.makedirs("/fp", exist_ok=True)
        fs.stat("/fp")
        fast = fs._fast
        assert fast is not None
        own_cluster.restart_service("meta1")
        assert fs.stat("/fp").st_nlink >= 2  # the dead socket is noticed; the async path answers
        assert fast.fallbacks >= 1
        assert fs.stat("/fp").st_nlink >= 2  # and the fast path reconnects
    finally:
        fs.close()


def test_fast_path_with_polling_before_sleep(fs: loomfs.LoomFS, base: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """LOOMFS_FASTPATH_SPIN_US: replies are polled for before the thread sleeps; answers agree."""
    from loomfs.client import fastpath

    monkeypatch.setattr(fastpath, "SPIN_US", 2000)
    fs.pipe(f"{base}/s", b"abc")
    fs.stat(base)
    result: list[object] = []

    def worker() -> None:  # a new thread: a new connection, made with polling on
        try:
            result.extend(fs.stat(f"{base}/s").st_size for _ in range(50))
            result.append(fs.cat(f"{base}/s"))
            conn = fs._fast._local.conn  # type: ignore[union-attr]
            result.append(conn.spin_hits + conn.spin_misses + conn.spin_paused)
        except BaseException as exc:
            result.append(exc)

    t = threading.Thread(target=worker)
    t.start()
    t.join(60)
    assert result[:50] == [3] * 50 and result[50] == b"abc"
    assert isinstance(result[51], int) and result[51] > 0  # it polled


def test_fast_path_replaces_an_idle_connection(fs: loomfs.LoomFS, base: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection unused past IDLE_RECONNECT_S is replaced before the call (meta may be closing
    it for idleness), with a new handshake; the call still goes the fast way."""
    from loomfs.client import fastpath

    fs.pipe(f"{base}/idle", b"1")
    fs.stat(base)
    fast = fs._fast
    assert fast is not None
    before = fast._local.conn
    monkeypatch.setattr(fastpath, "IDLE_RECONNECT_S", -1.0)
    fell_back = fast.fallbacks
    assert fs.stat(f"{base}/idle").st_size == 1
    assert fast._local.conn is not before and fast.fallbacks == fell_back
