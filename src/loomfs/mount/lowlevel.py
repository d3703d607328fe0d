"""libfuse's lock requests for a pyfuse3 mount, through ctypes.

pyfuse3 (3.5.0) registers no ``getlk``/``setlk``/``flock`` handlers, so the kernel keeps
flock/fcntl locks local to one mount, and its ``flush``/``release`` drop the ``lock_owner``
that unlock-at-close needs. libfuse copies pyfuse3's ``fuse_lowlevel_ops`` into its session
at ``pyfuse3.init()`` and decides at the kernel's INIT (run later, by ``pyfuse3.main()``)
whether to ask for POSIX and flock locks (``op.getlk && op.setlk``, ``op.flock``). So between
the two this module fills, in the session's copy, the getlk, setlk and flock slots with
ctypes callbacks and replaces flush and release by callbacks that see ``lock_owner`` (they
run the mount's own ``flush``/``release`` as pyfuse3 would, then drop the owner's locks).
The same way it fills the ``fallocate`` slot pyfuse3 has no handler for (``fallocate(1)`` and
``posix_fallocate`` got EOPNOTSUPP; glibc then writes a byte per block).

Finding the copy: pyfuse3's extension keeps its symbols (``.symtab``): its static ops table
(``__pyx_v_7pyfuse3_fuse_ops``) and the session pointer (``__pyx_v_7pyfuse3_session``), at
the module's load address (``PyInit_pyfuse3``'s address less its symbol value). The copy is
where the session's first bytes repeat the static table's first 16 pointers. Everything is
checked (libfuse 3.14's struct order and ``fuse_file_info`` layout, the pyfuse3 version, the
slots pyfuse3 left empty) and ``install`` returns None, leaving kernel-local locks, when
anything differs (``loomfs.mount.locks`` logs it).

Callbacks run inside ``fuse_session_process_buf`` on the FUSE loop's thread, holding the
GIL; they copy what they need out of libfuse's structs (valid only during the call), start
a task on the loop, and that task answers with ``fuse_reply_err``/``fuse_reply_lock``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

LIBFUSE_VERSION = 314  # fuse_version(): the struct order below is libfuse 3.14's
PYFUSE3_VERSIONS = ("3.5.0",)
SLOT_BYTES = 8
# slots of struct fuse_lowlevel_ops (libfuse 3.14, fuse_lowlevel.h)
SLOT_INIT, SLOT_LOOKUP, SLOT_FLUSH, SLOT_RELEASE = 0, 2, 17, 18
SLOT_GETLK, SLOT_SETLK, SLOT_FLOCK, SLOT_FALLOCATE = 31, 32, 39, 40
OPS_SLOTS = 44
MATCH_SLOTS = 16  # the copy is found by the static table's first pointers
SESSION_SCAN_BYTES = 512
SYM_SESSION = "__pyx_v_7pyfuse3_session"
SYM_OPS = "__pyx_v_7pyfuse3_fuse_ops"
SYM_INIT = "PyInit_pyfuse3"
FLOCK_RELEASE_BIT = 5  # fuse_file_info's bit field: writepage, direct_io, keep_cache, flush, nonseekable, flock_release


class FileInfo(ctypes.Structure):
    """struct fuse_file_info (libfuse 3.14): flags, a bit field, padding, fh, lock_owner."""

    _fields_ = [("flags", ctypes.c_int), ("bits", ctypes.c_uint), ("padding2", ctypes.c_uint),
                ("fh", ctypes.c_uint64), ("lock_owner", ctypes.c_uint64), ("poll_events", ctypes.c_uint32)]


class Flock(ctypes.Structure):
    """struct flock (x86-64 / aarch64 Linux)."""

    _fields_ = [("l_type", ctypes.c_short), ("l_whence", ctypes.c_short), ("l_start", ctypes.c_int64),
                ("l_len", ctypes.c_int64), ("l_pid", ctypes.c_int)]


class FuseCtx(ctypes.Structure):
    _fields_ = [("uid", ctypes.c_uint), ("gid", ctypes.c_uint), ("pid", ctypes.c_int), ("umask", ctypes.c_uint)]


GETLK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint64, ctypes.POINTER(FileInfo), ctypes.POINTER(Flock))
SETLK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint64, ctypes.POINTER(FileInfo), ctypes.POINTER(Flock),
                         ctypes.c_int)
FLOCK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint64, ctypes.POINTER(FileInfo), ctypes.c_int)
FILE_OP = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint64, ctypes.POINTER(FileInfo))
FALLOCATE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
                             ctypes.POINTER(FileInfo))


@dataclass(frozen=True, slots=True)
class LockReq:
    """What a lock callback copied out of libfuse: the request, inode, handle, owner."""

    req: int
    ino: int
    fh: int
    owner: int


@dataclass(slots=True)
class Handlers:
    """The mount's side: each gets the copied request and answers it (``Libfuse.reply_*``)."""

    getlk: Callable[[LockReq, int, int, int, int], None]  # (req, type, start, len, pid)
    setlk: Callable[[LockReq, int, int, int, int, bool], None]  # (req, type, start, len, pid, sleep)
    flock: Callable[[LockReq, int], None]  # (req, op)
    flush: Callable[[LockReq], None]
    release: Callable[[LockReq, bool], None]  # (req, flock_release)
    fallocate: Callable[[LockReq, int, int, int], None]  # (req, mode, offset, length)


def elf_symbols(path: str, names: set[str]) -> dict[str, int]:
    """Values of ``names`` in the ELF64 file's ``.symtab`` (little-endian)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path}: not a little-endian ELF64 file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    out: dict[str, int] = {}
    for sh in sections:
        if sh[1] != 2:  # SHT_SYMTAB
            continue
        strtab = sections[sh[6]]
        str_off = strtab[4]
        for k in range(sh[5] // 24):
            st_name, _info, _other, _shndx, st_value, _size = struct.unpack_from("<IBBHQQ", data, sh[4] + k * 24)
            end = data.index(b"\0", str_off + st_name)
            name = data[str_off + st_name : end].decode(errors="replace")
            if name in names:
                out[name] = st_value
    return out


class Libfuse:
    """libfuse's reply calls, and the lock slots put into a pyfuse3 session."""

    def __init__(self) -> None:
        lib = ctypes.CDLL(ctypes.util.find_library("fuse3") or "libfuse3.so.3")
        self.version = int(lib.fuse_version())
        lib.fuse_reply_err.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.fuse_reply_err.restype = ctypes.c_int
        lib.fuse_reply_lock.argtypes = [ctypes.c_void_p, ctypes.POINTER(Flock)]
        lib.fuse_reply_lock.restype = ctypes.c_int
        lib.fuse_req_interrupted.argtypes = [ctypes.c_void_p]
        lib.fuse_req_interrupted.restype = ctypes.c_int
        self._lib = lib
        self._keep: list[object] = []  # the ctypes callbacks: alive as long as the session

    def reply_err(self, req: int, err: int) -> None:
        rc = self._lib.fuse_reply_err(req, err)
        if rc:
            logger.warning("fuse_reply_err(%d): %d", err, rc)

    def reply_lock(self, req: int, type_: int, start: int, length: int, pid: int) -> None:
        lk = Flock(l_type=type_, l_whence=0, l_start=start, l_len=length, l_pid=pid)
        rc = self._lib.fuse_reply_lock(req, ctypes.byref(lk))
        if rc:
            logger.warning("fuse_reply_lock: %d", rc)

    def interrupted(self, req: int) -> bool:
        return bool(self._lib.fuse_req_interrupted(req))

    def install(self, pyfuse3_module: object, handlers: Handlers) -> str | None:
        """Fill the lock slots and wrap flush/release in the live session's ops; None when
        done, else why not (nothing was changed)."""
        version = getattr(pyfuse3_module, "__version__", "?")
        if self.version != LIBFUSE_VERSION:
            return f"libfuse {self.version} (the struct order known here is {LIBFUSE_VERSION}'s)"
        if version not in PYFUSE3_VERSIONS:
            return f"pyfuse3 {version} (known: {', '.join(PYFUSE3_VERSIONS)})"
        path = getattr(pyfuse3_module, "__file__", None)
        if not path:
            return "pyfuse3 has no file"
        syms = elf_symbols(path, {SYM_SESSION, SYM_OPS, SYM_INIT})
        if len(syms) != 3:
            return f"pyfuse3's symbols not found (have {sorted(syms)})"
        mod = ctypes.PyDLL(path)
        base = ctypes.cast(getattr(mod, SYM_INIT), ctypes.c_void_p).value
        if not base:
            return "pyfuse3's load address not found"
        base -= syms[SYM_INIT]
        session = ctypes.c_void_p.from_address(base + syms[SYM_SESSION]).value
        if not session:
            return "no pyfuse3 session (install after pyfuse3.init())"
        static = (ctypes.c_uint64 * OPS_SLOTS).from_address(base + syms[SYM_OPS])
        if not static[SLOT_INIT] or not static[SLOT_LOOKUP] or not static[SLOT_FLUSH] or not static[SLOT_RELEASE]:
            return "pyfuse3's ops table is not filled"
        if static[SLOT_GETLK] or static[SLOT_SETLK] or static[SLOT_FLOCK] or static[SLOT_FALLOCATE]:
            return "pyfuse3 has lock (or fallocate) handlers of its own"
        want = bytes(ctypes.string_at(ctypes.addressof(static), MATCH_SLOTS * SLOT_BYTES))
        seen = ctypes.string_at(session, SESSION_SCAN_BYTES)
        at = seen.find(want)
        if at < 0 or at % SLOT_BYTES:
            return "the session's copy of the ops table not found"
        copy = (ctypes.c_uint64 * OPS_SLOTS).from_address(session + at)
        if list(copy) != list(static):
            return "the session's copy differs from pyfuse3's table"
        callbacks = self._callbacks(handlers)
        self._keep.extend(callbacks.values())
        for slot, cb in callbacks.items():
            copy[slot] = ctypes.cast(cb, ctypes.c_void_p).value or 0
        logger.info("libfuse lock requests on (session ops at +%d; getlk, setlk, flock, flush, release, fallocate)",
                    at)
        return None

    def _callbacks(self, h: Handlers) -> dict[int, Any]:
        def safe(what: str, req: int, fn: Callable[[], None]) -> None:
            try:
                fn()
            except BaseException:  # never into C: answer the request
                logger.exception("%s: the handler failed", what)
                self.reply_err(req, 5)  # EIO

        def getlk(req: int, ino: int, fi: ctypes._Pointer[FileInfo], lock: ctypes._Pointer[Flock]) -> None:
            f, lk = fi.contents, lock.contents
            r = LockReq(req, ino, f.fh, f.lock_owner)
            safe("getlk", req, lambda: h.getlk(r, lk.l_type, lk.l_start, lk.l_len, lk.l_pid))

        def setlk(req: int, ino: int, fi: ctypes._Pointer[FileInfo], lock: ctypes._Pointer[Flock], sleep: int,
                  ) -> None:
            f, lk = fi.contents, lock.contents
            r = LockReq(req, ino, f.fh, f.lock_owner)
            args = (lk.l_type, lk.l_start, lk.l_len, lk.l_pid, bool(sleep))
            safe("setlk", req, lambda: h.setlk(r, *args))

        def flock(req: int, ino: int, fi: ctypes._Pointer[FileInfo], op: int) -> None:
            f = fi.contents
            r = LockReq(req, ino, f.fh, f.lock_owner)
            safe("flock", req, lambda: h.flock(r, op))

        def flush(req: int, ino: int, fi: ctypes._Pointer[FileInfo]) -> None:
            f = fi.contents
            r = LockReq(req, ino, f.fh, f.lock_owner)
            safe("flush", req, lambda: h.flush(r))

        def release(req: int, ino: int, fi: ctypes._Pointer[FileInfo]) -> None:
            f = fi.contents
            r = LockReq(req, ino, f.fh, f.lock_owner)
            flock_release = bool(f.bits >> FLOCK_RELEASE_BIT & 1)
            safe("release", req, lambda: h.release(r, flock_release))

        def fallocate(req: int, ino: int, mode: int, offset: int, length: int, fi: ctypes._Pointer[FileInfo]) -> None:
            f = fi.contents
            r = LockReq(req, ino, f.fh, f.lock_owner)
            safe("fallocate", req, lambda: h.fallocate(r, mode, offset, length))

        return {SLOT_GETLK: GETLK(getlk), SLOT_SETLK: SETLK(setlk), SLOT_FLOCK: FLOCK(flock),
                SLOT_FLUSH: FILE_OP(flush), SLOT_RELEASE: FILE_OP(release), SLOT_FALLOCATE: FALLOCATE(fallocate)}
