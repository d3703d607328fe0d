"""Wire types: one place for every message and method id (3FS's fbs/).

``wire.types`` (shared types), ``wire.mgmtd``, ``wire.meta``, ``wire.storage`` (one module
per service, numbered methods), ``wire.frame`` (framing codec), ``wire.status``.
"""
