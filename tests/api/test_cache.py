"""The credential cache: no database round trip on a hit, never a stale answer."""

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from keysvc.config import Settings
from keysvc.credentials import Hasher, new_secret
from keysvc.db.cache import CredentialCache
from keysvc.db.sqlite.store import Store
from keysvc.domain.keys import change_key, remove_key
from keysvc.errors import Unauthorized
from keysvc.http.state import HASHER, STORE
from keysvc.models import Credential, Key, KeyChange
from tests.handsql import hand_transaction
from tests.helpers import (
    UNAUTHORIZED,
    Client,
    ClientFactory,
    Creds,
    FakeClock,
    assert_error,
    assert_ok,
    basic,
    bootstrap,
    client_with,
    count_reads,
    create_creds,
    create_role,
    hash_data,
)

VERIFY = "/v1/verify"


async def test_a_cache_hit_skips_the_database(
    client: Client, admin: Creds, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = await create_creds(client, admin, {"name": "svc", "roles": ["developer"]})
    assert (await client.get(VERIFY, headers=svc.headers)).status == 200  # fills the cache
    reads = count_reads(client.app[STORE], monkeypatch)
    for _ in range(5):
        assert (await client.get(VERIFY, headers=svc.headers)).status == 200
    assert reads == []
    # And the secret is still checked on every request.
    wrong = await client.get(VERIFY, headers=basic(svc.key_id, "keysvc_wrong"))
    assert wrong.status == 401


async def test_own_details_served_from_cache_when_nothing_changed(
    client: Client, admin: Creds, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = await create_creds(client, admin, {"name": "svc", "roles": ["developer"]})
    url = f"/v1/organizations/{admin.organization_id}/keys/{svc.id}"
    await assert_ok(await client.get(url, headers=svc.headers))  # touches usedAt, reads
    await assert_ok(await client.get(url, headers=svc.headers))  # re-reads after the touch
    reads = count_reads(client.app[STORE], monkeypatch)
    awaited: list[str] = []
    original = Store.get_key

    async def counting(self: Store, organization_id: str, key_id: str) -> Key | None:
        awaited.append(key_id)
        return await original(self, organization_id, key_id)

    monkeypatch.setattr(Store, "get_key", counting)
    first = await assert_ok(await client.get(url, headers=svc.headers))
    assert reads == [] and first["usedAt"]
    assert awaited == []  # a hit is read synchronously, without the store's coroutine
    await assert_ok(await client.patch(url, json={"name": "renamed"}, headers=admin.headers))
    renamed = await assert_ok(await client.get(url, headers=svc.headers))
    assert renamed["name"] == "renamed"  # the write's own record, never the older one


async def warm(client: Client, creds: Creds) -> None:
    for _ in range(2):
        assert (await client.get(VERIFY, headers=creds.headers)).status == 200


async def test_every_kind_of_write_takes_effect_on_the_next_request(
    client: Client, admin: Creds, clock: FakeClock
) -> None:
    org = admin.organization_id
    role = await create_role(client, admin, {"name": "svc", "permissions": ["reports:read"]})
    svc = await create_creds(client, admin, {"name": "svc", "assignedRoleIds": [role["id"]]})
    key_url, role_url = (
        f"/v1/organizations/{org}/keys/{svc.id}",
        f"/v1/organizations/{org}/roles/{role['id']}",
    )
    needs = {**svc.headers, "X-Required-Permission": "reports:read"}

    await warm(client, svc)  # PATCH of the key
    await assert_ok(await client.patch(key_url, json={"state": "disabled"}, headers=admin.headers))
    await assert_error(await client.get(VERIFY, headers=svc.headers), 401, "key is disabled")
    await assert_ok(await client.patch(key_url, json={"state": "enabled"}, headers=admin.headers))

    await warm(client, svc)  # a change to a role the key holds
    await assert_ok(
        await client.patch(role_url, json={"permissions": ["other:read"]}, headers=admin.headers)
    )
    lacks = "this key lacks the permission reports:read"
    await assert_error(await client.get(VERIFY, headers=needs), 403, lacks)
    await assert_ok(
        await client.patch(role_url, json={"permissions": ["reports:read"]}, headers=admin.headers)
    )
    assert (await client.get(VERIFY, headers=needs)).status == 200

    await warm(client, svc)  # the IP access list
    fence = {"ipAccessList": [{"source": "10.0.0.0/8"}]}
    await assert_ok(await client.patch(key_url, json=fence, headers=admin.headers))
    fenced = "client address not allowed for this key"
    await assert_error(await client.get(VERIFY, headers=svc.headers), 403, fenced)
    await assert_ok(await client.patch(key_url, json={"ipAccessList": []}, headers=admin.headers))

    await warm(client, svc)  # expiry passing, with no write at all
    soon = clock.now.replace(microsecond=0) + timedelta(seconds=30)
    await assert_ok(
        await client.patch(key_url, json={"expireAt": soon.isoformat()}, headers=admin.headers)
    )
    await warm(client, svc)
    clock.advance(seconds=31)
    await assert_error(await client.get(VERIFY, headers=svc.headers), 401, "key has expired")
    await assert_ok(await client.patch(key_url, json={"expireAt": None}, headers=admin.headers))

    await warm(client, svc)  # DELETE
    await assert_ok(await client.delete(key_url, headers=admin.headers))
    assert (await client.get(VERIFY, headers=svc.headers)).status == 401


async def test_a_write_by_another_connection_is_seen(
    client: Client, admin: Creds, settings: Settings
) -> None:
    """As another process would: a connection of its own disables the key and bumps
    the generation; the very next request here is refused."""
    svc = await create_creds(client, admin, {"name": "svc", "roles": ["developer"]})
    await warm(client, svc)
    hand_transaction(
        settings,
        ("update api_keys set state = 'disabled' where id = ?", (svc.id,)),
        ("update meta set value = cast(value as integer) + 1 where name = 'auth_generation'", ()),
    )
    await assert_error(await client.get(VERIFY, headers=svc.headers), 401, "key is disabled")


async def test_cache_hits_write_used_at_once_a_minute(
    client: Client, admin: Creds, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = await create_creds(client, admin, {"name": "svc", "roles": ["developer"]})
    store = client.app[STORE]
    writes: list[str] = []
    original = store.touch_used

    async def counting(key_id: str, minute: Any) -> None:
        writes.append(key_id)
        await original(key_id, minute)

    monkeypatch.setattr(store, "touch_used", counting)
    clock.now = clock.now.replace(second=1)
    for _ in range(10):
        assert (await client.get(VERIFY, headers=svc.headers)).status == 200
    assert writes == [svc.id]
    clock.advance(minutes=1)
    for _ in range(3):
        assert (await client.get(VERIFY, headers=svc.headers)).status == 200
    assert writes == [svc.id, svc.id]


async def test_used_at_writes_do_not_flush_the_cache(client: Client, admin: Creds) -> None:
    keys = [
        await create_creds(client, admin, {"name": f"k{n}", "roles": ["developer"]})
        for n in range(5)
    ]
    for key in keys:
        assert (await client.get(VERIFY, headers=key.headers)).status == 200  # each touches usedAt
    store = client.app[STORE]
    cached = len(store.caches.credentials)
    assert cached == 6  # the five, and the admin key that created them
    for key in keys:
        assert (await client.get(VERIFY, headers=key.headers)).status == 200
    assert len(store.caches.credentials) == cached


async def test_cache_is_bounded(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> None:
    client = await client_with(aiohttp_client, settings, clock, cache_size=3)
    admin = await bootstrap(client.app)
    keys = [
        await create_creds(client, admin, {"name": f"k{n}", "roles": ["developer"]})
        for n in range(8)
    ]
    for key in keys * 2:
        assert (await client.get(VERIFY, headers=key.headers)).status == 200
    assert len(client.app[STORE].caches.credentials) == 3
    assert len(client.app[STORE].caches.credentials._proofs) == 3  # the headers' proofs too


def count_credential_hashing(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every key ID or secret hashed by authentication from now on."""
    hashed: list[str] = []
    original = Hasher.of_plain

    def counting(self: Hasher, value: str) -> bytes:
        hashed.append(value)
        return original(self, value)

    monkeypatch.setattr(Hasher, "of_plain", counting)
    return hashed


async def test_a_header_checked_before_is_known_by_its_keyed_hash(
    client: Client, admin: Creds, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same header again: neither its key ID nor its secret is hashed again.
    Any other header, a wrong secret for the same key included, is checked in full
    and never remembered; a change to the key takes effect on the next request."""
    svc = await create_creds(client, admin, {"name": "svc", "roles": ["developer"]})
    store = client.app[STORE]
    await warm(client, svc)
    proofs = dict(store.caches.credentials._proofs)
    hashed = count_credential_hashing(monkeypatch)
    for _ in range(3):
        assert (await client.get(VERIFY, headers=svc.headers)).status == 200
    assert hashed == []
    wrong_secret = new_secret()
    refused = await client.get(VERIFY, headers=basic(svc.key_id, wrong_secret))
    await assert_error(refused, 401, Unauthorized.default_message)
    assert hashed == [svc.key_id, wrong_secret]
    assert store.caches.credentials._proofs == proofs  # the wrong header is not remembered
    url = f"/v1/organizations/{admin.organization_id}/keys/{svc.id}"
    patched = await client.patch(url, json={"state": "disabled"}, headers=admin.headers)
    await assert_ok(patched)
    await assert_error(await client.get(VERIFY, headers=svc.headers), 401, "key is disabled")


def test_a_proof_holds_only_while_its_key_is_cached_with_the_same_secret() -> None:
    hasher = Hasher(b"pepper" * 8)
    now = datetime.now(UTC)
    key = Key("k", 1, "o", "svc", "enabled", "abcd", now, None, None, [], ())
    credential = Credential(key, hasher.of_plain("secret"))
    cache = CredentialCache(2)
    key_id_hash, proof = hasher.of_plain("id"), hasher.of_header("Basic aWQ6c2VjcmV0")
    cache.put(key_id_hash, credential, 1)
    assert cache.proven(proof) is None  # never proven
    cache.prove(proof, key_id_hash, credential)
    assert cache.proven(proof) is credential
    other = Credential(key, hasher.of_plain("another secret"))
    cache.put(key_id_hash, other, 2)  # the key now has another secret
    assert cache.proven(proof) is None
    cache.put(key_id_hash, credential, 3)
    assert cache.proven(proof) is credential
    cache.clear()
    assert cache.proven(proof) is None and cache._proofs == {}
    cache.put(key_id_hash, credential, 4)
    h0, h1, h2 = (hasher.of_header(f"h{n}") for n in range(3))
    cache.prove(h0, key_id_hash, credential)
    cache.prove(h1, key_id_hash, credential)
    assert cache.proven(h0) is credential  # used: now the most recent
    cache.prove(h2, key_id_hash, credential)  # bounded: the least recently used goes
    assert list(cache._proofs) == [h0, h2]
    off = CredentialCache(0)  # no cache: nothing is kept, proofs included
    off.put(key_id_hash, credential, 5)
    off.prove(proof, key_id_hash, credential)
    assert off.proven(proof) is None and off._proofs == {}


@pytest.mark.sqlite_only  # SQLite's create batches (keysvc.db.sqlite.createbatch)
async def test_concurrent_creates_share_transactions(
    client: Client, admin: Creds, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = client.app[STORE]
    begins: list[str] = []
    original = store.writer.conn.execute

    def execute(sql: str, *args: Any, **kwargs: Any) -> Any:
        if sql == "begin immediate":
            begins.append(sql)
        return original(sql, *args, **kwargs)

    monkeypatch.setattr(store.writer.conn, "execute", execute)
    dup = hash_data("same-key-id-for-two", "s")
    bodies: list[dict[str, Any]] = [{"name": f"k{n}", "roles": ["developer"]} for n in range(40)]
    bodies += [{"name": "dup1", "roles": ["developer"], "hashData": dup},
               {"name": "dup2", "roles": ["developer"], "hashData": dup}]  # fmt: skip
    url = f"/v1/organizations/{admin.organization_id}/keys"
    responses = await asyncio.gather(
        *(client.post(url, json=b, headers=admin.headers) for b in bodies)
    )
    statuses = sorted(r.status for r in responses)
    assert statuses == [200] * 41 + [409]  # one duplicate fails, alone
    assert len(begins) < 20  # 42 creates in far fewer transactions
    listed = await assert_ok(await client.get(url, headers=admin.headers))
    assert len(listed) == 42  # the admin and 41 created: every acknowledged create is there


def _write_between_reads(monkeypatch: pytest.MonkeyPatch, store: Store, write: Any) -> None:
    """Run ``write`` (a coroutine function) once, right after a read has read the key
    and before the cache keeps it, as a commit from another process may land there;
    then let another request see it (``data_version``), which drops the cache right
    away."""
    original = store.points.rows
    pending = [write]

    async def rows_then_a_write(sql: str, params: Any, *accept: Any) -> Any:
        rows = await original(sql, params, *accept)
        if pending:
            await pending.pop()()
            store.caches.data_version()
        return rows

    monkeypatch.setattr(store.points, "rows", rows_then_a_write)


async def test_a_credential_read_across_a_commit_is_not_kept(
    client: Client, admin: Creds, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key deleted while its credential was being read is not cached as it was: the
    next authentication reads again and is refused."""
    store: Store = client.app[STORE]
    victim = await create_creds(client, admin, {"name": "v", "roles": ["developer"]})
    key_id_hash = client.app[HASHER].of_plain(victim.key_id)
    _write_between_reads(
        monkeypatch, store, lambda: remove_key(store, admin.organization_id, victim.id)
    )
    read = await store.find_credential(key_id_hash)
    assert read is not None and read.key.id == victim.id  # read before the delete
    assert store.caches.cached_credential(key_id_hash) is None  # but not kept
    monkeypatch.undo()
    await assert_error(await client.get("/v1/whoami", headers=victim.headers), 401, UNAUTHORIZED)


async def test_a_key_read_across_a_commit_does_not_refresh_the_cache(
    client: Client, admin: Creds, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GET of a key refreshes its cached credential only if authorization did not move
    while it read: a key disabled meanwhile stays disabled for authentication."""
    store: Store = client.app[STORE]
    victim = await create_creds(client, admin, {"name": "v", "roles": ["developer"]})
    await assert_ok(await client.get("/v1/whoami", headers=victim.headers))  # cached
    await create_creds(client, admin, {"name": "other", "roles": ["developer"]})  # a commit
    key_id_hash = client.app[HASHER].of_plain(victim.key_id)

    async def disable_then_authenticate() -> None:
        await change_key(store, admin.organization_id, victim.id, KeyChange(state="disabled"))
        store.caches.data_version()
        # Another request authenticates meanwhile: the key is cached again, disabled.
        assert (await store.find_credential(key_id_hash)).key.state == "disabled"  # type: ignore[union-attr]

    _write_between_reads(monkeypatch, store, disable_then_authenticate)
    read = await store.get_key(admin.organization_id, victim.id)
    assert read is not None and read.state == "enabled"  # read before the PATCH
    monkeypatch.undo()
    cached = store.caches.cached_credential(key_id_hash)
    assert cached is None or cached.key.state == "disabled"
    response = await client.get("/v1/whoami", headers=victim.headers)
    await assert_error(response, 401, "key is disabled")
