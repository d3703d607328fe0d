"""Extended attributes of ``LoomFileSystem`` (``user.*``): fsspec has no xattr interface, so
these are plain methods shaped like ``os.getxattr`` & co., over the blocking client."""

from __future__ import annotations

from typing import Any

from loomfs.fsspec._base import LoomBase


class XattrOps(LoomBase):
    def getxattr(self, path: Any, name: str | bytes) -> bytes:
        return self.loom.getxattr(self._strip_protocol(path), name)

    def listxattr(self, path: Any) -> list[str]:
        return self.loom.listxattr(self._strip_protocol(path))

    def setxattr(self, path: Any, name: str | bytes, value: bytes, flags: int = 0) -> None:
        """``flags``: ``os.XATTR_CREATE`` / ``os.XATTR_REPLACE``."""
        self.loom.setxattr(self._strip_protocol(path), name, value, flags)

    def removexattr(self, path: Any, name: str | bytes) -> None:
        self.loom.removexattr(self._strip_protocol(path), name)
