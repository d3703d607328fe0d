"""Checksums of checkpoint items (no torch import)."""

from __future__ import annotations

from typing import Any

import crc32c


def crc(data: Any, value: int = 0) -> int:
    """CRC32C of ``data`` (any buffer), continuing from ``value``."""
    return int(crc32c.crc32c(data, value))
