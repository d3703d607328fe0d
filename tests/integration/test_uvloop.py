"""The optional uvloop event loop works with the LoomFS protocol (client side)."""

from __future__ import annotations

import os

import pytest

import loomfs

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_client_on_uvloop(cluster, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("uvloop")
    monkeypatch.setenv("LOOMFS_UVLOOP", "1")
    fs = loomfs.connect(str(cluster.root))
    try:
        assert type(fs.loop).__module__.startswith("uvloop")
        data = os.urandom((9 << 20) + 5)
        fs.makedirs("/uv", exist_ok=True)
        with fs.open("/uv/f", "wb") as f:
            f.write(data)
        assert fs.cat("/uv/f") == data
    finally:
        fs.close()
