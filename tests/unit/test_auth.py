"""Credentials, the handshake verifier, write grants and the rights policy (pure, no sockets)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from loomfs.common import grants
from loomfs.common.identity import SERVICE, Right
from loomfs.net.auth import AuthError, Verifier, client_proof, new_nonce, server_proof
from loomfs.net.credentials import (
    Claims,
    CredentialError,
    create_token,
    derive_key,
    load_secret_file,
    load_token_file,
    rights_for,
    service_credential,
    write_secret_file,
    write_token_file,
)
from loomfs.net.policy import needs_of
from loomfs.wire import mgmtd as wm
from loomfs.wire import storage as ws
from loomfs.wire.status import Status

SECRET = bytes(range(32))
NOW = 1_800_000_000.0


def _token(**kw: object) -> tuple[Claims, bytes]:
    cred = create_token(SECRET, uid=1000, gid=100, ttl_s=3600, now_s=NOW, **kw)  # type: ignore[arg-type]
    return cred.claims, cred.key


def _verify(v: Verifier, claims: Claims, key: bytes) -> object:
    sn, cn = new_nonce(), new_nonce()
    return v.verify(claims.to_wire(), client_proof(key, sn, cn), sn, cn)


def test_token_proves_its_claims_and_maps_to_an_identity() -> None:
    claims, key = _token(groups=(100, 7), tenant="t1", rights=rights_for(read_only=True))
    v = Verifier(SECRET, wall_clock=lambda: NOW + 10)
    sn, cn = new_nonce(), new_nonce()
    ok = v.verify(claims.to_wire(), client_proof(key, sn, cn), sn, cn)
    ident = ok.identity
    assert (ident.uid, ident.gid, ident.groups, ident.tenant) == (1000, 100, (7,), "t1")
    assert ident.rights == Right.READ and not ident.can(Right.WRITE)
    assert ok.server_proof == server_proof(key, sn, cn) and ok.expires_at_s == NOW + 3600


def test_forged_expired_replayed_and_foreign_credentials_are_refused() -> None:
    claims, key = _token()
    v = Verifier(SECRET, wall_clock=lambda: NOW + 10)
    # more rights with the old key: the server's key for the new claims differs
    forged = dataclasses.replace(claims, rights=int(Right.all()), uid=0)
    with pytest.raises(AuthError) as ei:
        _verify(v, forged, key)
    assert ei.value.status is Status.AUTH_FAILED
    # another cluster's secret
    other = create_token(b"x" * 32, uid=0, gid=0, ttl_s=3600, now_s=NOW)
    with pytest.raises(AuthError):
        _verify(v, other.claims, other.key)
    # replay: a proof made for one connection's nonces, presented with another server nonce
    sn, cn = new_nonce(), new_nonce()
    proof = client_proof(key, sn, cn)
    with pytest.raises(AuthError, match="replayed"):
        v.verify(claims.to_wire(), proof, new_nonce(), cn)
    # expired
    late = Verifier(SECRET, wall_clock=lambda: NOW + 3601)
    with pytest.raises(AuthError) as ei:
        _verify(late, claims, key)
    assert ei.value.status is Status.AUTH_EXPIRED
    # malformed claims
    for bad in (None, {"v": 1}, {**claims.to_wire(), "uid": -1}, {**claims.to_wire(), "groups": [1] * 100},
                {**claims.to_wire(), "rights": 1 << 40}, {**claims.to_wire(), "id": ""}):
        with pytest.raises(AuthError) as ei:
            v.verify(bad, b"x" * 32, sn, cn)
        assert ei.value.status is Status.AUTH_FAILED


def test_a_token_never_carries_the_service_right() -> None:
    claims, _ = _token(rights=Right.all())
    assert not claims.identity().can(Right.SERVICE)
    svc = service_credential(SECRET, "storage")
    v = Verifier(SECRET)
    assert _verify(v, svc.claims, svc.key).identity is SERVICE  # type: ignore[attr-defined]


def test_revocation_file_is_reread_when_it_changes(tmp_path: Path) -> None:
    claims, key = _token()
    now = [NOW]
    path = tmp_path / "revoked"
    v = Verifier(SECRET, revoked_file=str(path), wall_clock=lambda: now[0])
    _verify(v, claims, key)  # no file: nothing revoked
    path.write_text(f"# revoked by ops\n{claims.token_id}\n")
    now[0] += 2
    with pytest.raises(AuthError) as ei:
        _verify(v, claims, key)
    assert ei.value.status is Status.AUTH_REVOKED


def test_secret_and_token_files_are_private_and_round_trip(tmp_path: Path) -> None:
    secret = write_secret_file(tmp_path / "s")
    assert os.stat(tmp_path / "s").st_mode & 0o777 == 0o600
    assert load_secret_file(tmp_path / "s") == secret
    cred = create_token(secret, uid=5, gid=6, ttl_s=60, now_s=NOW, rights=rights_for(admin=True))
    write_token_file(tmp_path / "t", cred)
    assert os.stat(tmp_path / "t").st_mode & 0o777 == 0o600
    back = load_token_file(tmp_path / "t")
    assert back == cred and derive_key(secret, back.claims) == back.key
    os.chmod(tmp_path / "t", 0o644)
    with pytest.raises(CredentialError, match="readable by others"):
        load_token_file(tmp_path / "t")
    (tmp_path / "junk").write_text("{")
    os.chmod(tmp_path / "junk", 0o600)
    with pytest.raises(CredentialError, match="malformed"):
        load_token_file(tmp_path / "junk")


def test_write_grants_bind_inode_token_and_time() -> None:
    key = grants.grant_key(SECRET)
    g = grants.mint(key, 42, "tok1", NOW + 60)
    grants.verify(key, g, 42, "tok1", NOW)
    assert grants.expires_at_s(g) == NOW + 60
    cases = [
        (g, 43, "tok1", NOW, "not 43"),  # another inode
        (g, 42, "tok2", NOW, "another token"),  # stolen by another token
        (g, 42, "tok1", NOW + 61, "expired"),
        (b"", 42, "tok1", NOW, "no write grant"),
        (g[:-1], 42, "tok1", NOW, "malformed"),
        (g[:5] + bytes([g[5] ^ 1]) + g[6:], 42, "tok1", NOW, "forged"),  # inode bits flipped
        (grants.mint(grants.grant_key(b"y" * 32), 42, "tok1", NOW + 60), 42, "tok1", NOW, "forged"),
    ]
    for grant, inode, token, now, why in cases:
        with pytest.raises(grants.GrantError, match=why):
            grants.verify(key, grant, inode, token, now)


def test_policy_gates_admin_and_service_methods() -> None:
    assert needs_of(wm.DRAIN_NODE) == Right.ADMIN
    assert needs_of(wm.CREATE_CHAIN_TABLE) == Right.ADMIN
    assert needs_of(wm.REPORT_UNREACHABLE) == Right.SERVICE
    assert needs_of(wm.HEARTBEAT) == Right.SERVICE
    assert needs_of(wm.GET_ROUTING) == Right.NONE
    assert needs_of(ws.WRITE) == Right.WRITE and needs_of(ws.READ) == Right.READ
    user = _token()[0].identity()
    admin = _token(rights=rights_for(admin=True))[0].identity()
    assert not user.can(needs_of(wm.DRAIN_NODE)) and admin.can(needs_of(wm.DRAIN_NODE))
    assert not admin.can(needs_of(wm.HEARTBEAT)) and SERVICE.can(needs_of(wm.HEARTBEAT))


def test_revocations_from_mgmtd_reach_the_verifier_and_expire_with_their_tokens() -> None:
    from loomfs.net import revocations

    claims, key = _token()
    v = Verifier(SECRET, wall_clock=lambda: NOW + 10)
    saved = revocations.PROCESS.snapshot()
    try:
        revocations.PROCESS.replace({claims.token_id: claims.expires_at_s})  # what a poll brings
        with pytest.raises(AuthError) as ei:
            _verify(v, claims, key)
        assert ei.value.status is Status.AUTH_REVOKED and v.is_revoked(claims.token_id)
        revocations.PROCESS.prune(claims.expires_at_s + 1)  # past the token's expiry: dropped
        assert not v.is_revoked(claims.token_id)
    finally:
        revocations.PROCESS.replace(saved)
    r = revocations.Revocations()
    r.add("a", 10.0)
    r.add("a", 5.0)  # the later expiry is kept
    assert r.snapshot() == {"a": 10.0} and r.ids == {"a"}


def test_a_local_cluster_dir_uses_its_admin_token_unless_the_env_token_is_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from loomfs.net.auth import TOKEN_FILE_ENV, cluster_token_file

    root = tmp_path / "cl"
    secret = write_secret_file(root / "cluster.secret")
    write_token_file(root / "admin.token", create_token(secret, uid=0, gid=0, ttl_s=60, now_s=NOW))
    mine, other = tmp_path / "mine.token", tmp_path / "other.token"
    write_token_file(mine, create_token(secret, uid=7, gid=7, ttl_s=60, now_s=NOW))
    write_token_file(other, create_token(b"o" * 32, uid=0, gid=0, ttl_s=60, now_s=NOW))  # another cluster's
    monkeypatch.delenv(TOKEN_FILE_ENV, raising=False)
    assert cluster_token_file(root) == str(root / "admin.token")
    monkeypatch.setenv(TOKEN_FILE_ENV, str(mine))
    assert cluster_token_file(root) == str(mine)  # the user's token of this cluster stands
    monkeypatch.setenv(TOKEN_FILE_ENV, str(other))
    assert cluster_token_file(root) == str(root / "admin.token")  # another cluster's would be refused


def test_an_environment_token_file_that_vanished_is_reported_not_raised(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from loomfs.net import auth

    monkeypatch.setattr(auth, "_process_set", False)
    monkeypatch.delenv("LOOMFS_CLUSTER", raising=False)
    monkeypatch.setenv(auth.TOKEN_FILE_ENV, str(tmp_path / "gone.token"))
    assert auth.process_auth() is None
    assert "unusable" in caplog.text
