"""Logging setup shared by every service process."""

from __future__ import annotations

import logging
import os
import sys


def setup(service: str, level: str | None = None) -> None:
    level = level or os.environ.get("LOOMFS_LOG_LEVEL", "INFO")
    fmt = f"%(asctime)s {service}[%(process)d] %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=level.upper(), format=fmt, stream=sys.stderr, force=True)
