"""``LoomFileDataset``: a map-style dataset of whole files (one sample per file)."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Sequence
from typing import Any

from torch.utils.data import Dataset

from loomfs.torch.common import PathTable, Source, resolve

# a file an fsspec transaction is writing (loomfs.fsspec._file.temp_name): ".NAME.loomfs-HEX"
_TRANSACTION_TEMP = re.compile(r"\..+\.loomfs-[0-9a-f]{12}")


def _not_in_flight(paths: list[str], named: object = None) -> list[str]:
    """``paths`` less the files fsspec transactions are still writing (a file the caller
    ``named`` itself is kept whatever its name)."""
    return [p for p in paths if p == named or not _TRANSACTION_TEMP.fullmatch(posixpath.basename(p))]


def _named(exc: OSError, url: str, index: int) -> OSError:
    """The error with the file's URL and the dataset index in it."""
    # OSError(errno, ...) builds the matching subclass (FileNotFoundError for ENOENT...)
    return OSError(exc.errno, f"{exc.strerror or exc} (LoomFileDataset item {index})", url)


class LoomFileDataset(Dataset[Any]):
    """Files from a directory (every file below it, sorted), a glob (``/data/**/*.jpg``), or a
    list of paths, on LoomFS or local. Files an fsspec transaction is still writing (hidden
    ``.NAME.loomfs-HEX`` temporaries) are left out of a directory or glob.

    ``ds[i]`` is the file's bytes, or ``transform(bytes)``; with ``with_path`` the sample is
    ``(path, bytes)`` (and the transform gets that). ``ds.__getitems__(indices)`` (used by a
    DataLoader with a batch size) reads the whole batch with one ``read_many`` call.

    Paths are strings on LoomFS (``/data``, ``loom://HOST:PORT/data``, ``loom:///data``), with
    ``address`` or ``$LOOMFS_CLUSTER`` naming the cluster when the URL does not; local ones
    are ``file:/data`` or a ``pathlib.Path``. The file list is made once, here; the dataset
    pickles without a client (each process connects on first use), so it goes to DataLoader
    workers by fork or spawn and works with ``DistributedSampler``.
    """

    def __init__(self, source: Source, *, address: str | None = None,
                 transform: Callable[[Any], Any] | None = None, with_path: bool = False):
        self.store, where = resolve(source, address)
        found = self.store.expand(where)
        self.paths = PathTable(found if isinstance(where, list) else _not_in_flight(found, where))
        self.transform = transform
        self.with_path = with_path

    def __len__(self) -> int:
        return len(self.paths)

    def _finish(self, path: str, data: bytes) -> Any:
        sample: Any = (path, data) if self.with_path else data
        return self.transform(sample) if self.transform is not None else sample

    def _index(self, i: int) -> int:
        n = len(self.paths)
        j = int(i)
        if j < 0:
            j += n
        if not 0 <= j < n:
            raise IndexError(f"index {i} out of range for {n} files")
        return j

    def __getitem__(self, i: int) -> Any:
        j = self._index(i)
        path = self.paths[j]
        try:
            data = self.store.read_bytes(path)
        except OSError as exc:
            raise _named(exc, self.store.url(path), j) from exc
        return self._finish(path, data)

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        idx = [self._index(i) for i in indices]
        paths = [self.paths[j] for j in idx]
        out: list[Any] = []
        for j, path, data in zip(idx, paths, self.store.read_many(paths), strict=True):
            if isinstance(data, OSError):
                raise _named(data, self.store.url(path), j) from data
            out.append(self._finish(path, data))
        return out

    def __repr__(self) -> str:
        return f"LoomFileDataset({self.store!r} files={len(self.paths)})"

