"""The code stays ruff- and mypy-clean (STYLE.md): checked by the test suite CI runs."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool(name: str) -> str:
    exe = Path(sys.executable).with_name(name)
    found = str(exe) if exe.exists() else shutil.which(name)
    if not found:
        pytest.skip(f"{name} not installed (pip install -e .[test])")
    return found


@pytest.mark.timeout(300)
def test_ruff_clean() -> None:
    r = subprocess.run([_tool("ruff"), "check", "src", "tests", "benchmarks"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.timeout(600)
def test_mypy_clean() -> None:
    r = subprocess.run([_tool("mypy")], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
