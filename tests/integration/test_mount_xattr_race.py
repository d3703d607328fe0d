"""XATTR_CREATE / XATTR_REPLACE through the mount are decided by meta in one transaction:
two processes on two mounts (two clients) creating one attribute at the same moment cannot
both succeed. (pyfuse3 checks the flags with a getxattr before the setxattr; the mount passes
what that check implied on to meta, which applies it atomically.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_mount_options import mounted

import loomfs
from loomfs.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
ROUNDS = 40
ROUND_S = 0.04

# each round i: wait for the shared start time + i * ROUND_S, then try to create (or replace)
# attribute user.r<i> on the file; print what happened
RACER = r"""
import errno, json, os, sys, time
path, who, flag, start, rounds, step = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
flags = os.XATTR_CREATE if flag == "create" else os.XATTR_REPLACE
out = []
for i in range(rounds):
    t = start + i * step
    while time.time() < t:
        pass
    try:
        os.setxattr(path, f"user.r{i}", who.encode(), flags)
        out.append(0)
    except OSError as exc:
        out.append(exc.errno)
print(json.dumps(out))
"""


def _race(paths: list[Path], flag: str) -> list[list[int]]:
    start = time.time() + 1.5  # both interpreters up and waiting
    procs = [subprocess.Popen([sys.executable, "-c", RACER, str(p), f"w{k}", flag, str(start), str(ROUNDS),
                               str(ROUND_S)], stdout=subprocess.PIPE, text=True) for k, p in enumerate(paths)]
    results = []
    for pr in procs:
        out, _ = pr.communicate(timeout=60)
        assert pr.returncode == 0
        results.append(json.loads(out))
    return results


def test_two_mounts_racing_xattr_create_and_replace(cluster: LocalCluster) -> None:
    name = f"xrace-{os.getpid()}-{time.monotonic_ns()}"
    with loomfs.connect(str(cluster.root)) as fs:
        fs.pipe(f"/{name}", b"x")
    with mounted(cluster) as mp1, mounted(cluster) as mp2:
        paths = [mp1 / name, mp2 / name]
        a, b = _race(paths, "create")
        for i, (ra, rb) in enumerate(zip(a, b, strict=True)):
            assert sorted((ra, rb)) == [0, 17], f"round {i}: create answered {ra} and {rb} (EEXIST is 17)"
            winner = b"w0" if ra == 0 else b"w1"
            assert os.getxattr(paths[0], f"user.r{i}") == winner
        # replace: both succeed (the attribute exists) and the value is one of theirs
        a, b = _race(paths, "replace")
        assert a == b == [0] * ROUNDS
        # replace of a removed attribute: ENODATA, never re-created
        for i in range(ROUNDS):
            os.removexattr(paths[0], f"user.r{i}")
        a, b = _race(paths, "replace")
        assert a == b == [61] * ROUNDS  # ENODATA
        assert [n for n in os.listxattr(paths[1]) if n.startswith("user.r")] == []
    with loomfs.connect(str(cluster.root)) as fs:
        fs.unlink(f"/{name}")
