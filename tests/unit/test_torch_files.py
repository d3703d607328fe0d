"""``LoomFileDataset`` over a local directory (no cluster): files an fsspec transaction is
still writing are not samples (fsspec/torch bug hunt)."""

from __future__ import annotations

from pathlib import Path

from loomfs.fsspec._file import temp_name
from loomfs.torch import LoomFileDataset


def test_transaction_temporaries_are_not_samples(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(b"A")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.bin").write_bytes(b"B")
    temp = Path(temp_name(str(tmp_path / "sub" / "c.bin")))  # the name fsspec's transaction uses
    temp.write_bytes(b"half")
    (tmp_path / ".hidden").write_bytes(b"H")  # other dot-files stay samples
    ds = LoomFileDataset(tmp_path, with_path=True)
    assert [data for _, data in ds] == [b"H", b"A", b"B"]
    assert LoomFileDataset([temp])[0] == b"half"  # a path listed by the caller is taken as it is
    assert LoomFileDataset(temp)[0] == b"half"  # and so is one path named alone (review, session 14)
