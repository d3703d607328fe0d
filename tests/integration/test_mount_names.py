"""Names the mount knows are absent (``loomfs.mount.names``) through real mounts: the LOOKUP
before a create in a directory made or listed here costs no meta round trip; a name another
client made shows once the TTL has passed; O_EXCL and O_CREAT keep meta's answers."""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path

import pytest
from test_mount_options import mounted

import loomfs
from loomfs.mount.names import RELIST_MIN_ANSWERS
from loomfs.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _absent_hits(mp: Path) -> int:
    stats = json.loads(os.getxattr(mp, "user.loomfs.stats"))
    return int(stats["requests"].get("lookup_absent_cached", 0))


def test_creates_in_a_directory_made_or_listed_here(cluster: LocalCluster) -> None:
    with mounted(cluster, "-o", "absent_timeout=30") as mp, loomfs.connect(str(cluster.root)) as fs:
        d = mp / f"absent-{os.getpid()}-{time.monotonic_ns()}"
        d.mkdir()
        before = _absent_hits(mp)
        for i in range(20):
            (d / f"f{i}").write_bytes(b"x" * i)
        assert _absent_hits(mp) - before >= 20  # each create's LOOKUP answered here
        assert sorted(os.listdir(d)) == sorted(f"f{i}" for i in range(20))
        assert all((d / f"f{i}").read_bytes() == b"x" * i for i in range(20))
        # a directory made elsewhere, listed here in full: its new names are known absent
        other = f"/listed-{os.getpid()}-{time.monotonic_ns()}"
        fs.makedirs(other)
        fs.pipe(f"{other}/old", b"old")
        e = mp / other[1:]
        assert os.listdir(e) == ["old"]
        before = _absent_hits(mp)
        (e / "new").write_bytes(b"new")
        assert _absent_hits(mp) > before
        assert (e / "old").read_bytes() == b"old"  # a listed name is asked for, not hidden
        assert sorted(os.listdir(e)) == ["new", "old"]
        # unlink here: absent again, re-created
        os.unlink(d / "f0")
        assert not (d / "f0").exists()
        (d / "f0").write_bytes(b"again")
        assert (d / "f0").read_bytes() == b"again"


def test_a_name_made_elsewhere_keeps_meta_semantics(cluster: LocalCluster) -> None:
    """Within the TTL a name another client made may look absent to a plain LOOKUP, but a
    create of it gets meta's answer (EEXIST with O_EXCL, the file itself without), and once the
    TTL has passed it shows."""
    with mounted(cluster, "-o", "absent_timeout=1") as mp, loomfs.connect(str(cluster.root)) as fs:
        d = mp / f"elsewhere-{os.getpid()}-{time.monotonic_ns()}"
        d.mkdir()  # known empty here
        base = f"/{d.name}"
        fs.pipe(f"{base}/excl", b"theirs")
        fs.pipe(f"{base}/creat", b"theirs too")
        fs.pipe(f"{base}/later", b"seen")
        with pytest.raises(FileExistsError):
            os.open(d / "excl", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        fd = os.open(d / "creat", os.O_CREAT | os.O_RDWR, 0o644)  # opens theirs, no truncate
        try:
            assert os.pread(fd, 100, 0) == b"theirs too"
        finally:
            os.close(fd)
        assert fs.cat(f"{base}/excl") == b"theirs"
        deadline = time.monotonic() + 30
        while True:  # the TTL passes: the other client's file shows (no sleep-based assumption)
            try:
                assert (d / "later").read_bytes() == b"seen"
                break
            except FileNotFoundError:
                assert time.monotonic() < deadline, "a name made elsewhere stayed hidden past the TTL"
                time.sleep(0.1)


@pytest.mark.parametrize("opts", [("-o", "absent_timeout=0"), ()], ids=["zero", "strict-default"])
def test_absent_timeout_zero_asks_meta(cluster: LocalCluster, opts: tuple[str, ...]) -> None:
    """absent_timeout=0, and a strict mount's default: a name another client makes right after
    this mount's miss is seen by the next call (strict's promise), no LOOKUP answered here."""
    with mounted(cluster, *opts) as mp, loomfs.connect(str(cluster.root)) as fs:
        d = mp / f"off-{os.getpid()}-{time.monotonic_ns()}"
        d.mkdir()
        assert not (d / "x").exists()
        fs.pipe(f"/{d.name}/x", b"x")  # another client, right after this mount's miss
        assert (d / "x").read_bytes() == b"x"
        (d / "y").write_bytes(b"y")
        assert _absent_hits(mp) == 0
        with pytest.raises(OSError) as exc:
            os.rmdir(d)
        assert exc.value.errno == errno.ENOTEMPTY


def test_relaxed_mount_defaults_to_the_entry_ttl(cluster: LocalCluster) -> None:
    """consistency=relaxed: names known absent are kept for entry_timeout (the default of
    absent_timeout there), so a create loop's LOOKUPs are answered without meta."""
    with mounted(cluster, "-o", "consistency=relaxed,entry_timeout=30") as mp:
        d = mp / f"relaxed-{os.getpid()}-{time.monotonic_ns()}"
        d.mkdir()
        before = _absent_hits(mp)
        for i in range(10):
            (d / f"f{i}").write_bytes(b"x")
        assert _absent_hits(mp) - before >= 10


def _relists(mp: Path) -> int:
    return int(json.loads(os.getxattr(mp, "user.loomfs.stats"))["requests"].get("lookup_relist", 0))


def test_an_expired_listing_is_read_again_for_a_create_loop(cluster: LocalCluster) -> None:
    """Creates in one directory past the TTL: the listing is read again (one READDIR) and keeps
    answering; a name another client made meanwhile is in the new listing, so it shows."""
    with mounted(cluster, "-o", "absent_timeout=2") as mp, loomfs.connect(str(cluster.root)) as fs:
        d = mp / f"relist-{os.getpid()}-{time.monotonic_ns()}"
        d.mkdir()
        for i in range(RELIST_MIN_ANSWERS):
            (d / f"f{i}").write_bytes(b"x")  # the mkdir's listing answers their LOOKUPs
        fs.pipe(f"/{d.name}/theirs", b"theirs")
        deadline = time.monotonic() + 60
        n = RELIST_MIN_ANSWERS
        while _relists(mp) == 0:
            assert time.monotonic() < deadline, "the listing was never read again"
            (d / f"f{n}").write_bytes(b"x")
            n += 1
        hits = _absent_hits(mp)
        (d / "after").write_bytes(b"x")  # answered from the new listing
        assert _absent_hits(mp) == hits + 1
        assert (d / "theirs").read_bytes() == b"theirs"
        assert len(os.listdir(d)) == n + 2
