"""Consistency modes, chosen per connection and per path prefix, and the client caches they
govern (see docs/consistency.md for the exact guarantees).

- ``strict`` (the default; close-to-open): every stat and open asks meta, so a change another
  client closed (or any metadata change another client made) is seen by the next call.
  Attribute and directory-entry caches are not used. File data may still be served from
  the data caches when the attributes meta just returned name the same version (inode,
  size, mtime, ctime) as a cached copy: a *revalidated* hit.
- ``relaxed`` (for datasets): attributes, negative lookups (ENOENT), directory listings and
  file data are served from the caches for up to a TTL after meta last said so, without a
  round trip. Another client's change may be missed for up to the TTL; data is always one
  whole version of the file (it is keyed by the attributes it belongs to). This client's own
  changes invalidate what it cached for the paths it names.

``ConsistencyPolicy`` maps a path to its mode: the longest configured prefix (matched at
path-component boundaries) wins, else the connection's default. ``ClientCaches`` is what
the client calls: look-ups that answer only where the mode allows, ``learn_*`` calls that
store what meta answered, and ``changed``/``created`` for this client's own changes.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from loomfs.client import paths
from loomfs.client.cache import ABSENT, Absent, AttrCache, DataCache, DataKey, ListingCache
from loomfs.client.diskcache import DiskCache
from loomfs.common.clock import SYSTEM_CLOCK, Clock
from loomfs.wire.types import Attr, DirEntry, FileType

if TYPE_CHECKING:
    from loomfs.config import ClientConfig

logger = logging.getLogger(__name__)


class Mode(enum.Enum):
    STRICT = "strict"
    RELAXED = "relaxed"

    @classmethod
    def parse(cls, value: Mode | str) -> Mode:
        if isinstance(value, Mode):
            return value
        try:
            return cls(value.strip().lower())
        except ValueError:
            raise ValueError(f"unknown consistency mode {value!r} (strict or relaxed)") from None


class ConsistencyPolicy:
    """Path -> mode: the longest matching prefix, else ``default``.

    A prefix matches itself and everything below it (``/data`` matches ``/data/x``, not
    ``/database``)."""

    def __init__(self, default: Mode | str = Mode.STRICT, prefixes: Mapping[str, Mode | str] | None = None):
        self.default = Mode.parse(default)
        self.prefixes = {paths.normalize(p): Mode.parse(m) for p, m in (prefixes or {}).items()}

    @classmethod
    def of(cls, default: Mode | str = Mode.STRICT, *, relaxed: Iterable[str] = (),
           strict: Iterable[str] = ()) -> ConsistencyPolicy:
        """From lists of prefixes per mode (a prefix in both lists is an error)."""
        prefixes: dict[str, Mode] = {}
        for mode, items in ((Mode.RELAXED, relaxed), (Mode.STRICT, strict)):
            for p in items:
                n = paths.normalize(p)
                if prefixes.get(n, mode) is not mode:
                    raise ValueError(f"prefix {n} is configured both strict and relaxed")
                prefixes[n] = mode
        return cls(default, prefixes)

    def mode_for(self, path: str) -> Mode:
        """``path``: normalised."""
        if not self.prefixes:
            return self.default
        p = path
        while True:
            mode = self.prefixes.get(p)
            if mode is not None:
                return mode
            if p == "/":
                return self.default
            p = p.rpartition("/")[0] or "/"

    def relaxed(self, path: str) -> bool:
        return self.mode_for(path) is Mode.RELAXED

    @property
    def any_relaxed(self) -> bool:
        return self.default is Mode.RELAXED or Mode.RELAXED in self.prefixes.values()

    def __repr__(self) -> str:
        extra = " ".join(f"{p}={m.value}" for p, m in sorted(self.prefixes.items()))
        return f"ConsistencyPolicy({self.default.value}{' ' + extra if extra else ''})"


def _ancestors(path: str) -> list[str]:
    """``/a/b/c`` -> ``['/a/b', '/a', '/']``."""
    out = []
    p = path
    while p != "/":
        p = p.rpartition("/")[0] or "/"
        out.append(p)
    return out


class ClientCaches:
    """The caches of one client, used as its consistency policy allows.

    All paths are normalised. Safe to call from any thread (the caches lock)."""

    def __init__(
        self,
        policy: ConsistencyPolicy | None = None,
        *,
        attr_ttl_s: float = 1.0,
        negative_ttl_s: float | None = None,
        entry_ttl_s: float | None = None,
        attrs: AttrCache | None = None,
        listings: ListingCache | None = None,
        data: DataCache | None = None,
        disk: DiskCache | None = None,
        listing_names_max: int = 16384,
        clock: Clock = SYSTEM_CLOCK,
    ):
        self.policy = policy or ConsistencyPolicy()
        self.attr_ttl_s = attr_ttl_s
        self.negative_ttl_s = attr_ttl_s if negative_ttl_s is None else negative_ttl_s
        self.entry_ttl_s = attr_ttl_s if entry_ttl_s is None else entry_ttl_s
        self.attrs = attrs if attrs is not None else AttrCache(clock=clock)
        self.listings = listings if listings is not None else ListingCache(clock=clock)
        self.data = data  # None: no memory data cache
        self.disk = disk  # None: no disk data cache
        self.listing_names_max = listing_names_max  # bigger listings are not cached
        self.clock = clock
        self._lock = threading.Lock()
        self.revalidated_hits = 0  # data hits whose attributes came fresh from meta (strict)

    @classmethod
    def from_config(cls, config: ClientConfig, *, namespace: str = "", clock: Clock = SYSTEM_CLOCK) -> ClientCaches:
        """The caches a ``ClientConfig`` asks for; ``namespace`` keeps clusters apart in a
        shared disk cache directory (e.g. the mgmtd address)."""
        policy = ConsistencyPolicy.of(config.consistency, relaxed=config.relaxed_prefixes,
                                      strict=config.strict_prefixes)
        ttl = config.attr_cache_ttl_s
        data = None
        if config.data_cache_bytes_max > 0 and config.data_cache_entries_max > 0:
            data = DataCache(config.data_cache_bytes_max, config.data_cache_entries_max,
                             entry_bytes_max=config.data_cache_entry_bytes_max)
        disk = None
        if config.disk_cache_dir:
            try:
                disk = DiskCache(config.disk_cache_dir, config.disk_cache_bytes_max, namespace=namespace,
                                 entry_bytes_max=config.data_cache_entry_bytes_max)
            except (OSError, ValueError) as exc:  # a cache must not stop the client
                logger.warning("disk cache %s is off: %s", config.disk_cache_dir, exc)
        return cls(
            policy,
            attr_ttl_s=ttl,
            negative_ttl_s=ttl if config.negative_cache_ttl_s < 0 else config.negative_cache_ttl_s,
            entry_ttl_s=ttl if config.entry_cache_ttl_s < 0 else config.entry_cache_ttl_s,
            attrs=AttrCache(config.attr_cache_entries_max, clock=clock),
            listings=ListingCache(config.listing_cache_entries_max, clock=clock),
            data=data,
            disk=disk,
            listing_names_max=config.listing_cache_names_max,
            clock=clock,
        )

    def relaxed(self, path: str) -> bool:
        return self.policy.mode_for(path) is Mode.RELAXED

    def now(self) -> float:
        """Take this before asking meta and pass it as ``asked_at`` to ``learn_*``: an entry
        then lives at most the TTL past the moment meta could have answered it."""
        return self.clock.monotonic()

    # --- attributes -------------------------------------------------------------------

    def attr(self, path: str, follow_symlinks: bool = True) -> Attr | Absent | None:
        """A cached answer the mode allows: attributes, ``ABSENT`` (ENOENT), or None (ask meta)."""
        if not self.relaxed(path):
            return None
        return self.attrs.lookup(path, follow_symlinks)

    def learn_attr(self, path: str, follow_symlinks: bool, attr: Attr, *, asked_at: float | None = None) -> None:
        """Meta answered ``attr`` for ``path`` (to a request sent at ``asked_at``)."""
        if self.relaxed(path):
            self.attrs.put(path, follow_symlinks, attr, self.attr_ttl_s, asked_at)

    def learn_absent(self, path: str, follow_symlinks: bool = True, *, asked_at: float | None = None) -> None:
        """Meta answered ENOENT for ``path``."""
        if self.relaxed(path):
            self.attrs.put_absent(path, follow_symlinks, self.negative_ttl_s, asked_at)

    # --- directory entries ------------------------------------------------------------

    def listing(self, path: str, with_attrs: bool = False) -> list[DirEntry] | None:
        if not self.relaxed(path):
            return None
        return self.listings.lookup(path, with_attrs)

    def learn_listing(self, path: str, entries: list[DirEntry], with_attrs: bool, *,
                      asked_at: float | None = None) -> None:
        """A complete listing of ``path``; with attributes, each child's ``lstat`` too."""
        if not self.relaxed(path) or len(entries) > self.listing_names_max:
            return
        self.listings.put(path, entries, with_attrs, self.entry_ttl_s, asked_at)
        if with_attrs:
            for e in entries:
                if e.attr is not None:
                    self.learn_attr(paths.join(path, e.name), False, e.attr, asked_at=asked_at)

    # --- data -------------------------------------------------------------------------

    @property
    def caches_data(self) -> bool:
        return self.data is not None or self.disk is not None

    def data_for(self, attr: Attr, *, revalidated: bool = False) -> bytes | None:
        """The whole content of the file version ``attr`` names, if cached (memory, then
        disk). ``revalidated``: ``attr`` came fresh from meta (counted apart)."""
        if attr.type != FileType.FILE or not self.caches_data:
            return None
        key = DataKey.of(attr)
        data = self.data.get(key) if self.data is not None else None
        if data is None and self.disk is not None:
            data = self.disk.get(key)
            if data is not None and self.data is not None:
                self.data.put(key, data)
        if data is not None and len(data) != attr.size:  # cannot happen; never serve it
            return None
        if data is not None and revalidated:
            with self._lock:
                self.revalidated_hits += 1
        return data

    def learn_data(self, attr: Attr, data: bytes) -> None:
        """``data`` is the whole content of the version ``attr`` names."""
        if attr.type != FileType.FILE or len(data) != attr.size or not self.caches_data:
            return
        key = DataKey.of(attr)
        if self.data is not None:
            self.data.put(key, data)
        if self.disk is not None:
            self.disk.put_later(key, data)  # never waits on file creation

    def wants_data(self, size: int) -> bool:
        """Whether a file of ``size`` bytes would be cached whole."""
        limits = [c.entry_bytes_max for c in (self.data, self.disk) if c is not None]
        return bool(limits) and size <= max(limits)

    # --- this client's own changes ----------------------------------------------------

    def changed(self, path: str, *, tree: bool = False, inode: int = 0) -> None:
        """This client changed ``path`` (its attributes, its data, or removed it). ``tree``:
        it is (or was) a directory whose subtree moved or went away. ``inode``: the file's
        data changed, so its cached versions are dead."""
        if not (self.attrs.ever_stored or self.listings.ever_stored or (inode and self.data is not None)):
            return  # a strict client: nothing cached by name, no tombstone to leave (as _forget)
        if tree:
            self.attrs.invalidate_tree(path)
            self.listings.invalidate_tree(path)
        else:
            self.attrs.invalidate(path)
            self.listings.invalidate(path)
        self.listings.invalidate(paths.split(path)[0])  # its entry (and attributes) there
        if inode and self.data is not None:
            self.data.discard_inode(inode)

    def created(self, path: str, *, parents: bool = False) -> None:
        """This client created ``path`` (``parents``: and any missing ancestors)."""
        self.changed(path)
        if parents:
            for p in _ancestors(path):
                self.attrs.invalidate(p)
                self.listings.invalidate(p)

    def renamed(self, src: str, dst: str) -> None:
        self.changed(src, tree=True)
        self.changed(dst, tree=True)

    def clear(self) -> None:
        self.attrs.clear()
        self.listings.clear()
        if self.data is not None:
            self.data.clear()

    def __repr__(self) -> str:
        return (f"ClientCaches({self.policy!r} ttl={self.attr_ttl_s}s {self.attrs!r} "
                f"{self.data!r} {self.disk!r})")


__all__ = ["ABSENT", "Absent", "ClientCaches", "ConsistencyPolicy", "Mode"]
