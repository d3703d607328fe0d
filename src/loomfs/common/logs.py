"""Logging setup shared by every service process: one format, a trace id on every line."""

from __future__ import annotations

import logging
import os
import sys

from loomfs.common.trace import TraceFilter


def setup(service: str, level: str | None = None) -> None:
    level = level or os.environ.get("LOOMFS_LOG_LEVEL", "INFO")
    fmt = f"%(asctime)s {service}[%(process)d] %(levelname)s %(name)s [%(trace)s]: %(message)s"
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(fmt))
    handler.addFilter(TraceFilter())
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
