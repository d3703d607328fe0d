"""Model-based test: random namespace and data operations applied to LoomFS and to a local
directory; results (data, sizes, listings, errno) must agree."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule, run_state_machine_as_test

import loomfs

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

NAMES = st.sampled_from(["a", "b", "c", "d"])
PATHS = st.lists(NAMES, min_size=1, max_size=3).map(lambda parts: "/".join(parts))
DATA = st.one_of(st.binary(max_size=64), st.integers(1, 3 << 20).map(lambda n: bytes([n % 251]) * n))


def _outcome(fn, *args):  # type: ignore[no-untyped-def]
    try:
        return ("ok", fn(*args))
    except OSError as exc:
        return ("err", exc.errno)


class LoomVsLocal(RuleBasedStateMachine):
    fs: loomfs.LoomFS
    cluster_dir: str

    @initialize()
    def setup(self) -> None:
        self.local = tempfile.mkdtemp(prefix="loomfs-model-")
        self.remote = f"/model-{os.path.basename(self.local)}"
        self.fs.makedirs(self.remote, exist_ok=False)

    def teardown(self) -> None:
        shutil.rmtree(self.local, ignore_errors=True)

    def L(self, p: str) -> str:
        return os.path.join(self.local, p)

    def R(self, p: str) -> str:
        return f"{self.remote}/{p}"

    steps = 0

    def same(self, local, remote) -> None:  # type: ignore[no-untyped-def]
        LoomVsLocal.steps += 1
        lo, ro = _outcome(*local), _outcome(*remote)
        if lo == ("ok", None) and ro[0] == "ok":
            ro = ("ok", None)  # the local call returns nothing to compare (mkdir, rename, ...)
        # Linux reports EISDIR/ENOTDIR/ENOTEMPTY variants consistently; we require the exact errno
        assert lo == ro, f"local={lo} loomfs={ro}"

    @rule(p=PATHS)
    def mkdir(self, p: str) -> None:
        self.same((os.mkdir, self.L(p)), (self.fs.mkdir, self.R(p)))

    @rule(p=PATHS, data=DATA)
    def write(self, p: str, data: bytes) -> None:
        def lw(path: str) -> int:
            with open(path, "wb") as f:
                return f.write(data)

        def rw(path: str) -> int:
            with self.fs.open(path, "wb") as f:
                return f.write(data)

        self.same((lw, self.L(p)), (rw, self.R(p)))

    @rule(p=PATHS, data=st.binary(min_size=1, max_size=5000))
    def append(self, p: str, data: bytes) -> None:
        def la(path: str) -> int:
            with open(path, "ab") as f:
                return f.write(data)

        def ra(path: str) -> int:
            with self.fs.open(path, "ab") as f:
                return f.write(data)

        self.same((la, self.L(p)), (ra, self.R(p)))

    @rule(p=PATHS, off=st.integers(0, 5 << 20), data=st.binary(min_size=1, max_size=3000))
    def pwrite(self, p: str, off: int, data: bytes) -> None:
        def lw(path: str) -> int:
            with open(path, "r+b") as f:
                f.seek(off)
                return f.write(data)

        def rw(path: str) -> int:
            with self.fs.open(path, "r+b") as f:
                f.seek(off)
                return f.write(data)

        self.same((lw, self.L(p)), (rw, self.R(p)))

    @rule(p=PATHS)
    def read(self, p: str) -> None:
        def lr(path: str) -> bytes:
            with open(path, "rb") as f:
                return f.read()

        self.same((lr, self.L(p)), (self.fs.cat, self.R(p)))

    @rule(p=PATHS, size=st.integers(0, 4 << 20))
    def truncate(self, p: str, size: int) -> None:
        self.same((os.truncate, self.L(p), size), (self.fs.truncate, self.R(p), size))

    @rule(p=PATHS)
    def unlink(self, p: str) -> None:
        self.same((os.unlink, self.L(p)), (self.fs.unlink, self.R(p)))

    @rule(p=PATHS)
    def rmdir(self, p: str) -> None:
        self.same((os.rmdir, self.L(p)), (self.fs.rmdir, self.R(p)))

    @rule(a=PATHS, b=PATHS)
    def rename(self, a: str, b: str) -> None:
        self.same((os.rename, self.L(a), self.L(b)), (self.fs.rename, self.R(a), self.R(b)))

    @rule(a=PATHS, b=PATHS)
    def link(self, a: str, b: str) -> None:
        self.same((os.link, self.L(a), self.L(b)), (self.fs.link, self.R(a), self.R(b)))

    @rule(p=PATHS)
    def stat(self, p: str) -> None:
        def ls(path: str) -> tuple[bool, int, int]:
            s = os.stat(path)
            return (os.path.isdir(path), 0 if os.path.isdir(path) else s.st_size, s.st_nlink if not os.path.isdir(path) else 0)

        def rs(path: str) -> tuple[bool, int, int]:
            import stat as S

            s = self.fs.stat(path)
            d = S.S_ISDIR(s.st_mode)
            return (d, 0 if d else s.st_size, 0 if d else s.st_nlink)

        self.same((ls, self.L(p)), (rs, self.R(p)))

    @rule(p=st.one_of(st.just(""), PATHS))
    def listdir(self, p: str) -> None:
        self.same(
            (lambda x: sorted(os.listdir(x)), self.L(p)),
            (lambda x: sorted(self.fs.listdir(x)), self.R(p).rstrip("/")),
        )


def test_loomfs_matches_local_directory(cluster) -> None:  # type: ignore[no-untyped-def]
    fs = loomfs.connect(str(cluster.root))
    LoomVsLocal.fs = fs
    LoomVsLocal.cluster_dir = str(cluster.root)
    try:
        run_state_machine_as_test(
            LoomVsLocal,
            settings=settings(
                max_examples=int(os.environ.get("LOOMFS_MODEL_EXAMPLES", "150")),
                stateful_step_count=40,
                deadline=None,
                suppress_health_check=list(HealthCheck),
                derandomize=True,
                database=None,
            ),
        )
    finally:
        fs.close()
    print(f"model test: {LoomVsLocal.steps} compared operations")
    assert LoomVsLocal.steps > 100
