"""``loomfs.common.malloc_tune``: with it, a service's burst of allocations reuses freed
memory instead of faulting fresh pages in (measured as the process's minor page faults).
Each case runs in its own interpreter: the settings are process-wide."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CHURN = """
import os, resource, sys
from loomfs.common import malloc_tune
tuned = malloc_tune.tune(library=sys.argv[1] == "library")

def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

def churn(rounds):
    f0 = faults()
    for _ in range(rounds):  # a READ_MANY reply: a hundred 4 KiB contents, their joined payload, freed
        parts = [os.urandom(16) * 256 for _ in range(100)]
        payload = b"".join(parts)
        del parts, payload
    return (faults() - f0) / rounds

churn(5)
print(tuned, churn(100))
"""


def _run(mode: str, **env: str) -> tuple[bool, float]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "LOOMFS_MALLOC"))}
    out = subprocess.run([sys.executable, "-c", CHURN, mode], env={**full, **env}, capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    return out[0] == "True", float(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_tuned_process_reuses_freed_memory() -> None:
    tuned, faults = _run("service")
    assert tuned
    assert faults < 5, f"{faults} page faults per round with the settings"
    off, faults_off = _run("service", LOOMFS_MALLOC_TUNE="0")
    assert not off
    assert faults_off > 50, f"only {faults_off} faults per round with glibc's defaults"


def test_library_tunes_only_when_asked() -> None:
    assert _run("library")[0] is False
    assert _run("library", LOOMFS_MALLOC_TUNE="1")[0] is True
    assert _run("service", MALLOC_TRIM_THRESHOLD_="1000000")[0] is False  # the process's own settings win
