"""meta service (id 2): the namespace. Path-based calls, one round trip each.

Truncates: meta cuts the chunks itself (``loomfs.meta.trim``) before it answers a call that
shrinks a file; clients never trim. Every shrink starts a new *truncate epoch* of the file:
write opens, SETATTR and length reports answer the current one, and a writer sends the
epoch it knows with its length reports (SYNC, CLOSE), so meta can tell a stale report.

Paths are absolute, '/'-separated, already normalised by the client (``..`` resolved
lexically, never above the root); the server validates them again (NUL bytes, components
longer than 255 bytes, empty components) and answers EINVAL / ENAMETOOLONG.
"""

from __future__ import annotations

from loomfs.common.identity import Right
from loomfs.wire.message import Empty, Message, many, message, method
from loomfs.wire.types import SERVICE_META, Attr, DirEntry, Layout


@message
class PathReq(Message):
    path: str = ""
    follow_symlinks: bool = True


@message
class AttrRsp(Message):
    attr: Attr | None = None
    trunc_epoch: int = 0  # SYNC/CLOSE: the file's truncate epoch now (other calls: 0)
    write_grant: bytes = b""  # MIGRATE on a cluster with a secret: a write grant (as OpenRsp's)


@message
class MkdirReq(Message):
    path: str = ""
    mode: int = 0o755
    parents: bool = False  # like mkdir -p: create missing ancestors
    exist_ok: bool = False
    uid: int = 0
    gid: int = 0


@message
class OpenReq(Message):
    path: str = ""
    flags: int = 0  # os.O_* bits: O_RDONLY/O_WRONLY/O_RDWR, O_CREAT, O_EXCL, O_TRUNC, O_APPEND
    mode: int = 0o644
    uid: int = 0
    gid: int = 0
    client_id: int = 0  # write opens register a session under this client
    # write opens: the session id the client chose (0 = meta picks). A retry after a lost
    # reply sends the same id and meta answers from that session: the open applies once.
    session_id: int = 0
    # a whole small file in one round trip: with O_CREAT|O_WRONLY, ``data`` (CRC32C
    # ``data_crc``) becomes the file's content, kept inline in meta, and no write session is
    # opened. If it does not fit the directory's inline limit the call is an ordinary write
    # open (with ``session_id``) and the client writes the bytes to chunks.
    data: bytes | None = None
    data_crc: int = 0
    # create (or O_TRUNC) the file with its data in chunks, not inline: the writer knows it
    # is going to be big
    chunked: bool = False


@message
class OpenRsp(Message):
    attr: Attr | None = None
    session_id: int = 0  # nonzero for write opens
    truncated_from: int = 0  # O_TRUNC: the length before truncation (meta cut those chunks)
    session_lease_s: float = 0.0  # renew write sessions (RENEW_SESSIONS) well within this; 0 = never expire
    replayed: bool = False  # the open had been applied (a retry): nothing created or truncated now
    trunc_epoch: int = 0  # write opens: the file's truncate epoch (sent back with SYNC/CLOSE)
    # inline files (attr.inline): their content, and its CRC32C (None for chunked files)
    data: bytes | None = None
    data_crc: int = 0
    # write opens on a cluster with a secret: meta's signed permission for this connection's
    # token to write this inode's chunks (``loomfs.common.grants``); sent with every chunk
    # write; renewed with RENEW_SESSIONS. b"" without a secret.
    write_grant: bytes = b""
    # opens for reading a chunked file on a cluster with a secret: meta's read grant for this
    # token (``loomfs.common.grants``), sent with every chunk READ; b"" otherwise
    read_grant: bytes = b""


@message
class ReadRsp(Message):
    """READ: a file's attributes, and its content when it is inline (one round trip for a
    small file); a chunked file's bytes are read from storage with ``attr.layout``."""

    attr: Attr | None = None
    data: bytes | None = None
    data_crc: int = 0
    read_grant: bytes = b""  # a chunked file: as OpenRsp.read_grant


@message
class InlinePatch(Message):
    offset: int = 0
    data: bytes = b""


@message
class InlineWriteReq(Message):
    """An inline file's writer sends its writes (applied in order, in one transaction; gaps
    read as zeros). ``close``: its write session ends too."""

    inode: int = 0
    session_id: int = 0
    patches: list[InlinePatch] = many()
    crc: int = 0  # CRC32C over the patches' data, concatenated
    mtime_ns: int = 0  # 0 = now
    close: bool = False


@message
class InlineWriteRsp(Message):
    attr: Attr | None = None  # None: the inode is gone
    # False: nothing applied, the file is in chunks now (``attr``): write there
    applied: bool = True
    trunc_epoch: int = 0


@message
class InodeReq(Message):
    inode: int = 0


@message
class CloseReq(Message):
    inode: int = 0
    session_id: int = 0
    length: int = -1  # highest byte written + 1 by this session; -1 = wrote nothing
    mtime_ns: int = 0  # 0 = now if length >= 0
    # the truncate epoch the writer knows (from OPEN, SETATTR or its last SYNC): older than
    # the file's means a truncate came after, and the report does not grow the length
    trunc_epoch: int = 0


@message
class SyncReq(Message):
    """fsync / periodic length report from an open writer."""

    inode: int = 0
    length: int = -1  # highest byte written + 1 since the writer last learned a new epoch
    mtime_ns: int = 0
    trunc_epoch: int = 0  # as CloseReq
    # the writer's session: a caller who lost write permission since its open (chmod) still
    # reports lengths through it, as an open fd keeps writing (0: write permission needed)
    session_id: int = 0
    # EC files (``Layout.ec_reduced``): a writer about to write a stripe without some of its
    # fragments marks the file (a new generation); a scrub that repaired the whole file
    # clears the generation it started with (nothing when a newer one was marked meanwhile)
    ec_reduced: bool = False
    ec_reduced_done: int = 0


@message
class RenewSessionsReq(Message):
    """A writer's lease renewal of the write sessions it holds (sessions it does not name,
    such as one from an OPEN whose reply was lost, are left to expire)."""

    client_id: int = 0
    session_ids: list[int] = many()  # at most RENEW_SESSIONS_MAX
    # optional, parallel to session_ids: each session's inode, to get a fresh write grant
    # for it (``RenewSessionsRsp.write_grants``); empty: no grants asked
    inodes: list[int] = many()


@message
class RenewSessionsRsp(Message):
    renewed: int = 0  # how many of them meta still held (the others expired or were closed)
    # with ``inodes`` on a cluster with a secret: per session id, in order, a fresh write grant
    # for a session this client still holds, b"" for the others
    write_grants: list[bytes] = many()


RENEW_SESSIONS_MAX = 8192


@message
class ReaddirReq(Message):
    path: str = ""
    after: str = ""  # cursor: return names strictly greater than this
    limit: int = 1024
    with_attrs: bool = False
    # the directory a listing began in (the first page's ``dir_inode``): when ``path`` leads to
    # another inode now (renamed away, another made under its name), ENOENT instead of that
    # one's entries; 0: whichever directory ``path`` names
    dir_inode: int = 0


@message
class ReaddirRsp(Message):
    entries: list[DirEntry] = many()
    more: bool = False  # another page follows; pass the last name as `after`
    dir_inode: int = 0  # the directory listed: the next pages pass it (0 from an older meta)


@message
class RenameReq(Message):
    src: str = ""
    dst: str = ""
    no_replace: bool = False  # RENAME_NOREPLACE: EEXIST if dst exists
    exchange: bool = False  # RENAME_EXCHANGE: src and dst (both existing) swap
    # replace dst only if it is still this file (inode != 0: same inode, size and mtime) and
    # no writer has it open, else EBUSY: a layout conversion's switch (``client.ec_convert``)
    expect_inode: int = 0
    expect_size: int = 0
    expect_mtime_ns: int = 0


@message
class SymlinkReq(Message):
    target: str = ""
    path: str = ""
    uid: int = 0
    gid: int = 0


@message
class ReadlinkRsp(Message):
    target: str = ""


@message
class LinkReq(Message):
    src: str = ""
    dst: str = ""
    follow_symlinks: bool = False  # False = link(2) on Linux (src symlink itself is linked)


@message
class MknodReq(Message):
    """A special file (FileType.FIFO, SOCKET, CHAR_DEVICE, BLOCK_DEVICE)."""

    path: str = ""
    type: int = 0
    mode: int = 0o644
    rdev: int = 0  # devices: the device number
    uid: int = 0
    gid: int = 0


@message
class SetattrReq(Message):
    path: str = ""
    follow_symlinks: bool = True
    mode: int = -1  # -1 = unchanged
    uid: int = -1
    gid: int = -1
    atime_ns: int = -1
    mtime_ns: int = -1
    size: int = -1  # truncate/extend (meta cuts the chunks); the reply's truncated_from says the old length
    # nonzero: change this inode (an open file, whatever its names are now; ``path`` only
    # names it in errors): ftruncate/fchmod/futimens, also after a rename or the last unlink
    inode: int = 0
    # utimes(path, NULL): atime and mtime := meta's clock (atime_ns/mtime_ns ignored). The
    # owner or a caller with write permission may; explicit times only the owner (or root)
    times_now: bool = False


@message
class SetattrRsp(Message):
    attr: Attr | None = None
    truncated_from: int = -1
    trunc_epoch: int = 0  # the file's truncate epoch after the call


@message
class StatfsRsp(Message):
    files: int = 0
    directories: int = 0
    bytes_used: int = 0  # sum of file lengths (logical)
    gc_pending: int = 0
    trims_pending: int = 0  # truncated files whose chunks are still to be cut


@message
class SetLayoutReq(Message):
    path: str = ""
    layout: Layout | None = None


@message
class UnlinkRsp(Message):
    """Unlink/rmdir: the removed inode and whether its data went to the GC queue."""

    inode: int = 0
    gc_queued: bool = False


# Rights (``loomfs.common.identity``): calls that change the namespace or a file need WRITE
# (a read-only token gets EPERM from the RPC server before meta runs); GC reports need
# ADMIN. POSIX permissions are checked in meta on top (``loomfs.meta.perm``).
_W = Right.WRITE

STAT = method(SERVICE_META, 1, "stat", PathReq, AttrRsp, idempotent=True)
MKDIR = method(SERVICE_META, 2, "mkdir", MkdirReq, AttrRsp, needs=_W)
# OPEN also reads: meta refuses a write/create/truncate open without WRITE (EPERM, as here)
OPEN = method(SERVICE_META, 3, "open", OpenReq, OpenRsp)
CLOSE = method(SERVICE_META, 4, "close", CloseReq, AttrRsp, idempotent=True, needs=_W)
SYNC = method(SERVICE_META, 5, "sync", SyncReq, AttrRsp, idempotent=True, needs=_W)
READDIR = method(SERVICE_META, 6, "readdir", ReaddirReq, ReaddirRsp, idempotent=True)
RENAME = method(SERVICE_META, 7, "rename", RenameReq, Empty, needs=_W)
UNLINK = method(SERVICE_META, 8, "unlink", PathReq, UnlinkRsp, needs=_W)
RMDIR = method(SERVICE_META, 9, "rmdir", PathReq, UnlinkRsp, needs=_W)
SYMLINK = method(SERVICE_META, 10, "symlink", SymlinkReq, AttrRsp, needs=_W)
READLINK = method(SERVICE_META, 11, "readlink", PathReq, ReadlinkRsp, idempotent=True)
LINK = method(SERVICE_META, 12, "link", LinkReq, AttrRsp, needs=_W)
SETATTR = method(SERVICE_META, 13, "setattr", SetattrReq, SetattrRsp, needs=_W)
STATFS = method(SERVICE_META, 14, "statfs", Empty, StatfsRsp, idempotent=True)
SET_LAYOUT = method(SERVICE_META, 15, "set_layout", SetLayoutReq, AttrRsp, idempotent=True, needs=_W)
META_PING = method(SERVICE_META, 16, "ping", Empty, Empty, idempotent=True)
RENEW_SESSIONS = method(SERVICE_META, 17, "renew_sessions", RenewSessionsReq, RenewSessionsRsp, idempotent=True)
READ = method(SERVICE_META, 18, "read", PathReq, ReadRsp, idempotent=True)
WRITE_INLINE = method(SERVICE_META, 19, "write_inline", InlineWriteReq, InlineWriteRsp, needs=_W)
# an inline file's data moves to chunks (a writer is about to grow it past the limit)
MIGRATE = method(SERVICE_META, 20, "migrate", InodeReq, AttrRsp, idempotent=True, needs=_W)  # reply: write_grant


GC_QUEUED_INODES_MAX = 4096  # per GC_QUEUED request


@message
class InodesReq(Message):
    inodes: list[int] = many()


@message
class InodesRsp(Message):
    inodes: list[int] = many()


# which of these inodes wait in the GC queue (unlinked; chunks not removed yet): fsck's question
GC_QUEUED = method(SERVICE_META, 40, "gc_queued", InodesReq, InodesRsp, idempotent=True, needs=Right.ADMIN)
# which of these inodes exist in meta (any tenant's): fsck's check before it calls chunks
# orphans, since tenants' trees cannot be walked from the shared root
INODES_LIVE = method(SERVICE_META, 41, "inodes_live", InodesReq, InodesRsp, idempotent=True, needs=Right.ADMIN)
MKNOD = method(SERVICE_META, 21, "mknod", MknodReq, AttrRsp, needs=_W)


# tenants (``loomfs.meta.tenancy``): administrators create a tenant's root directory; a token
# naming the tenant then sees only that tree
@message
class TenantCreateReq(Message):
    name: str = ""
    uid: int = 0  # owner of the tenant's root directory
    gid: int = 0
    mode: int = 0o755


@message
class TenantInfo(Message):
    name: str = ""
    number: int = 0  # inode numbers of the tenant are number << 48 | n
    root: Attr | None = None


@message
class TenantListRsp(Message):
    tenants: list[TenantInfo] = many()


TENANT_CREATE = method(SERVICE_META, 60, "tenant_create", TenantCreateReq, TenantInfo, needs=Right.ADMIN)
TENANT_LIST = method(SERVICE_META, 61, "tenant_list", Empty, TenantListRsp, idempotent=True, needs=Right.ADMIN)
