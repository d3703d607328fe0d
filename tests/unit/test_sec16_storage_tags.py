"""Security hunt 16: what an authenticated, non-admin client can do to other clients' chunks
through storage's retry dedupe and chunk listings.

* The head's in-flight dedupe cache (``TagCache``) was keyed by the request tag alone
  (client id, request id): a client that knew another client's id (QUERY_CHUNKS showed every
  chunk's tags to any token of the tenant) could write *its own* chunk under that client's
  next request ids; the victim's later write with such an id was answered with the attacker's
  reply and never applied: an acknowledged write silently lost, without any permission on the
  victim's file.
* QUERY_CHUNKS of an inode of the caller's tenant answered every chunk's CRC32C and request
  tags, with no read grant: a token without r on a file learnt a checksum of its content (a
  guess of the content confirmed offline) and the client ids of its writers.

Handlers called directly on a one-replica StorageService over a memory engine, with write
grants required (no sockets, virtual time).
"""

from __future__ import annotations

import crc32c
import pytest
from test_storage_tenant_check import CHUNK_SIZE, TID, Node, _ctx, _run

from loomfs.common import grants
from loomfs.common.identity import SERVICE, TENANT_SHIFT, Identity, Right
from loomfs.errors import StatusError
from loomfs.storage.grantcheck import GrantCheck
from loomfs.wire.storage import (
    ChunkId,
    QueryChunksReq,
    RemoveChunksReq,
    RequestTag,
    TruncateReq,
    WriteReq,
)

KEY = b"k" * 32
VICTIM_INODE = 2 << TENANT_SHIFT | 100  # tenant "alpha"
ATTACKER_INODE = 2 << TENANT_SHIFT | 200
VICTIM_CLIENT = 0x1234_5678_9ABC_DEF0


def _user(uid: int, tenant: str = "alpha") -> Identity:
    return Identity(uid=uid, gid=uid, tenant=tenant, rights=Right.user(), token_id=f"tok-{uid}")


def _grant(who: Identity, inode: int) -> bytes:
    return grants.mint(KEY, inode, who.token_id, 4e9)


async def _write(n: Node, who: Identity, inode: int, data: bytes, tag: RequestTag) -> None:
    req = WriteReq(chain_id=1, chain_version=1, chunk=ChunkId(inode=inode, index=0), offset=0, length=len(data),
                   chunk_size=CHUNK_SIZE, data_crc=crc32c.crc32c(data), tag=tag, grant=_grant(who, inode))
    await n.svc.write(req, _ctx(who, data))


def _setup(n: Node) -> None:
    n.svc.grant_check = GrantCheck(KEY, required=True)


@pytest.mark.parametrize("poison", ["write", "truncate", "remove"])
def test_another_users_request_ids_cannot_swallow_a_write(poison: str) -> None:
    """The attacker has no permission on the victim's file (no grant for it): it only writes,
    truncates or removes chunks of its own file, under the victim's next request id."""
    victim, attacker = _user(1001), _user(1002)

    async def body(n: Node) -> None:
        _setup(n)
        await _write(n, victim, VICTIM_INODE, b"version 1", RequestTag(client_id=VICTIM_CLIENT, request_id=1))
        await _write(n, attacker, ATTACKER_INODE, b"mine", RequestTag(client_id=7, request_id=1))
        evil = RequestTag(client_id=VICTIM_CLIENT, request_id=2)  # the victim's next request id
        if poison == "write":
            await _write(n, attacker, ATTACKER_INODE, b"attacker", evil)
        elif poison == "truncate":
            await n.svc.truncate(TruncateReq(chain_id=1, chain_version=1, chunk=ChunkId(inode=ATTACKER_INODE),
                                             length=1, chunk_size=CHUNK_SIZE, tag=evil,
                                             grant=_grant(attacker, ATTACKER_INODE)), _ctx(attacker))
        else:
            await n.svc.remove_chunks(RemoveChunksReq(chain_id=1, chain_version=1, inode=ATTACKER_INODE, tag=evil,
                                                      grant=_grant(attacker, ATTACKER_INODE)), _ctx(attacker))
        try:
            await _write(n, victim, VICTIM_INODE, b"version 2", RequestTag(client_id=VICTIM_CLIENT, request_id=2))
        except StatusError:
            pass  # a refusal would at least be visible; silently dropping it is the hole
        assert await n.read(VICTIM_INODE, SERVICE) == b"version 2"

    _run(body)


def test_a_retry_of_the_same_request_is_still_deduplicated() -> None:
    """The binding keeps what the cache is for: the same client's retry of the same request
    (same chunk) joins the first run instead of applying twice."""
    victim = _user(1001)

    async def body(n: Node) -> None:
        _setup(n)
        tag = RequestTag(client_id=VICTIM_CLIENT, request_id=5)
        await _write(n, victim, VICTIM_INODE, b"first", tag)
        hits = n.svc.tags.hits
        await _write(n, victim, VICTIM_INODE, b"first", tag)  # the retry
        assert n.svc.tags.hits == hits + 1
        st = n.svc.targets[TID].engine.get(n.svc.targets[TID].engine.list_chunks(VICTIM_INODE, 0, 1, 1)[0].key)
        assert st is not None and st.commit_ver == 1

    _run(body)


def test_a_chunk_listing_shows_a_client_no_checksums_or_request_tags() -> None:
    """A token of the same tenant without any grant lists another user's file's chunks: it
    learns which exist, their lengths and versions (a writer's fenced trim needs them), not
    their CRC32C nor the writers' client ids. Services and admins see everything (fsck)."""
    victim, other = _user(1001), _user(1002)

    async def body(n: Node) -> None:
        _setup(n)
        data = b"secret content"
        await _write(n, victim, VICTIM_INODE, data, RequestTag(client_id=VICTIM_CLIENT, request_id=1))
        req = QueryChunksReq(target_id=TID, inode=VICTIM_INODE)
        rsp = await n.svc.query_chunks(req, _ctx(other))
        [m] = rsp.chunks
        assert m.chunk is not None and m.chunk.inode == VICTIM_INODE and m.length == len(data) and m.commit_ver == 1
        assert m.crc == 0 and m.tags == []
        for who in (SERVICE, Identity(uid=0, gid=0, rights=Right.user() | Right.ADMIN, token_id="adm")):
            [m] = (await n.svc.query_chunks(req, _ctx(who))).chunks
            assert m.crc == crc32c.crc32c(data) and m.tags[:2] == [VICTIM_CLIENT, 1]

    _run(body)
