"""Issue 15's CLI paper cuts against a real cluster: ls -l, put into/over, mv into a
directory, options after the subcommand, ``--json | head``."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import loomfs
from loomfs.cli.main import main
from loomfs.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _run(cluster: LocalCluster, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(["--dir", str(cluster.root), *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_ls_long_shows_type_owner_and_human_sizes(cluster: LocalCluster, fs: loomfs.LoomFS, base: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    fs.makedirs(f"{base}/sub")
    fs.pipe(f"{base}/f", b"x" * 3000)
    fs.symlink(f"{base}/f", f"{base}/ln")
    rc, out, _ = _run(cluster, capsys, "ls", "-l", "-h", base)
    assert rc == 0
    rows = {line.split()[-1] if "->" not in line else line.split()[-3]: line for line in out.splitlines()}
    assert rows["sub"].startswith("d") and rows["f"].startswith("-") and rows["ln"].startswith("l")
    assert "?" not in "".join(line[0] for line in rows.values())
    assert "2.9K" in rows["f"] and f"-> {base}/f" in rows["ln"]
    assert all(len(line.split()) >= 7 for line in rows.values())  # mode links owner group size date time name


def test_put_into_a_directory_missing_parent_and_overwrite(cluster: LocalCluster, fs: loomfs.LoomFS, base: str,
                                                          tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "in.bin"
    src.write_bytes(b"one")
    rc, _, err = _run(cluster, capsys, "put", str(src), f"{base}/no/such/x.bin")
    assert rc == 1 and "does not exist" in err and "-p" in err
    assert not fs.exists(f"{base}/no")
    assert _run(cluster, capsys, "put", "-p", str(src), f"{base}/no/such/x.bin")[0] == 0
    assert fs.cat(f"{base}/no/such/x.bin") == b"one"
    assert _run(cluster, capsys, "put", str(src), f"{base}/no/")[0] == 0  # into the directory
    assert fs.cat(f"{base}/no/in.bin") == b"one"
    src.write_bytes(b"two")
    rc, _, err = _run(cluster, capsys, "put", str(src), f"{base}/no/in.bin")
    assert rc == 1 and os.strerror(errno.EEXIST) in err and "--force" in err
    assert fs.cat(f"{base}/no/in.bin") == b"one"
    rc, _, err = _run(cluster, capsys, "put", "--force", str(src), f"{base}/no/in.bin")
    assert rc == 0 and "overwrote" in err and fs.cat(f"{base}/no/in.bin") == b"two"


def test_mv_into_a_directory(cluster: LocalCluster, fs: loomfs.LoomFS, base: str,
                             capsys: pytest.CaptureFixture[str]) -> None:
    fs.makedirs(f"{base}/dir")
    fs.pipe(f"{base}/a", b"a")
    fs.pipe(f"{base}/b", b"b")
    assert _run(cluster, capsys, "mv", f"{base}/a", f"{base}/dir/")[0] == 0
    assert _run(cluster, capsys, "mv", f"{base}/b", f"{base}/dir")[0] == 0
    assert sorted(fs.listdir(f"{base}/dir")) == ["a", "b"]
    assert _run(cluster, capsys, "mv", f"{base}/dir/a", f"{base}/c")[0] == 0  # a plain rename still
    assert fs.cat(f"{base}/c") == b"a"
    rc, _, err = _run(cluster, capsys, "mv", f"{base}/c", f"{base}/c2/")
    assert rc == 1 and fs.exists(f"{base}/c")


def test_options_after_the_subcommand(cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["admin", "targets", "--json", "--dir", str(cluster.root)]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 6
    mgmtd = json.loads((cluster.root / "cluster.json").read_text())["mgmtd"]
    assert main(["admin", "nodes", "--json", "--mgmtd", mgmtd]) == 0
    assert json.loads(capsys.readouterr().out)
    assert main(["top", "--once", "--interval-s", "0.2", "--dir", str(cluster.root)]) == 0


def test_json_into_a_closed_pipe_exits_quietly(cluster: LocalCluster) -> None:
    r, w = os.pipe()
    os.close(r)  # the reader is gone before we write (``| head -0``)
    try:
        proc = subprocess.run([sys.executable, "-m", "loomfs.cli.main", "admin", "targets", "--json",
                               "--dir", str(cluster.root)], stdout=w, stderr=subprocess.PIPE, text=True,
                              timeout=60)
    finally:
        os.close(w)
    assert "Broken pipe" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 0
