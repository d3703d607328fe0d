"""A POSIX mount of LoomFS through FUSE (pyfuse3) on the one async client core.

``loomfs mount MOUNTPOINT`` (``loomfs.cli.mount``) runs :func:`serve`; the kernel's
inode-based requests are turned into the client's path-based calls through an
:class:`InodeTable` (no I/O, unit-tested). See docs/mount.md.
"""

from loomfs.mount.inodes import InodeTable
from loomfs.mount.options import MountOptions

__all__ = ["InodeTable", "MountOptions"]
