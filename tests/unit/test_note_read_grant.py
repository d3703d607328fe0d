"""An open reply that carries a read grant fills the storage client's read grants (no
READ_GRANTS round trip before the first READ); one without leaves them as they were."""

from __future__ import annotations

import time
from types import SimpleNamespace

from loomfs.client.readgrants import ReadGrants
from loomfs.client.storage_client import note_grant
from loomfs.common import grants


def test_open_reply_read_grant_is_kept() -> None:
    store = SimpleNamespace(read_grants=ReadGrants(), write_grants={})
    g = grants.mint(grants.read_grant_key(b"s" * 32), 42, "tok", time.time() + 600)
    note_grant(store, 42, SimpleNamespace(read_grant=g, write_grant=b""))
    assert store.read_grants.get(42) == g and store.write_grants == {}
    note_grant(store, 43, SimpleNamespace(write_grant=b"w"))  # no read grant in the reply
    assert store.read_grants.get(43) == b"" and store.write_grants == {43: b"w"}
    expired = grants.mint(grants.read_grant_key(b"s" * 32), 44, "tok", time.time() - 1)
    note_grant(store, 44, SimpleNamespace(read_grant=expired))
    assert store.read_grants.get(44) == b""
