"""Authentication: every failure looks alike until the secret is proven."""

import base64
import hmac
import sys
from collections import Counter

import pytest

from keysvc.credentials import BASE62, SECRET_PREFIX, Hasher, new_secret
from keysvc.domain.permissions import has_permission
from keysvc.http.auth import parse_basic
from keysvc.http.state import STORE
from tests.helpers import (
    UNAUTHORIZED,
    Client,
    Creds,
    FakeClock,
    assert_error,
    assert_ok,
    basic,
    count_reads,
    create_creds,
)


def url(creds: Creds) -> str:
    return f"/v1/organizations/{creds.organization_id}/keys/{creds.id}"


def b64(text: bytes) -> str:
    return base64.b64encode(text).decode()


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "Basic",
        "Basic ",
        "Bearer abc",
        "Basic !!!not-base64!!!",
        f"Basic {b64(b'no-colon')}",
        f"Basic {b64(b':secret-only')}",
        f"Basic {b64(b'id-only:')}",
        f"Basic {b64(bytes([0xFF, 0xFE, 0x3A, 0x41]))}",
        f"Basic {b64(b'a:b')} Basic {b64(b'a:b')}",
    ],
)
async def test_missing_or_malformed_credentials(
    client: Client, admin: Creds, header: str | None
) -> None:
    headers = {} if header is None else {"Authorization": header}
    response = await client.get(url(admin), headers=headers)
    await assert_error(response, 401, UNAUTHORIZED)
    assert response.headers["WWW-Authenticate"] == 'Basic realm="keysvc"'


async def test_unknown_key_and_wrong_secret_look_the_same(client: Client, admin: Creds) -> None:
    unknown = await client.get(url(admin), headers=basic("A" * 20, admin.secret))
    wrong = await client.get(url(admin), headers=basic(admin.key_id, new_secret()))
    first = await assert_error(unknown, 401, UNAUTHORIZED)
    second = await assert_error(wrong, 401, UNAUTHORIZED)
    assert first.keys() == second.keys()
    assert unknown.headers["WWW-Authenticate"] == wrong.headers["WWW-Authenticate"]


async def test_bad_checksum_refused_without_database_lookup(
    client: Client, admin: Creds, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = client.app[STORE]
    calls: list[bytes] = []
    original = store.caches.cached_credential  # the first look, cache or database

    def counting(key_id_hash: bytes):  # type: ignore[no-untyped-def]
        calls.append(key_id_hash)
        return original(key_id_hash)

    monkeypatch.setattr(store.caches, "cached_credential", counting)
    tampered = admin.secret[:-1] + ("A" if admin.secret[-1] != "A" else "B")
    await assert_error(
        await client.get(url(admin), headers=basic(admin.key_id, tampered)), 401, UNAUTHORIZED
    )
    short = SECRET_PREFIX + "abc"
    await assert_error(
        await client.get(url(admin), headers=basic(admin.key_id, short)), 401, UNAUTHORIZED
    )
    assert calls == []
    await assert_ok(await client.get(url(admin), headers=admin.headers))
    assert len(calls) == 1


async def test_disabled_key_refused_after_secret(client: Client, admin: Creds) -> None:
    off = await create_creds(
        client, admin, {"name": "off", "roles": ["admin"], "state": "disabled"}
    )
    await assert_error(await client.get(url(admin), headers=off.headers), 401, "key is disabled")
    # A wrong secret for the disabled key says nothing about its state.
    wrong = await client.get(url(admin), headers=basic(off.key_id, new_secret()))
    await assert_error(wrong, 401, UNAUTHORIZED)


async def test_expired_key_refused(client: Client, admin: Creds, clock: FakeClock) -> None:
    expiry = clock.now.replace(microsecond=0).isoformat()
    clock.advance(seconds=-60)
    soon = await create_creds(
        client, admin, {"name": "soon", "roles": ["admin"], "expireAt": expiry}
    )
    await assert_ok(await client.get(url(admin), headers=soon.headers))
    clock.advance(seconds=120)
    await assert_error(await client.get(url(admin), headers=soon.headers), 401, "key has expired")


async def test_used_at_written_at_most_once_a_minute(
    client: Client, admin: Creds, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = client.app[STORE]
    writes: list[str] = []
    original = store.touch_used

    async def counting(key_id, minute):  # type: ignore[no-untyped-def]
        writes.append(minute.isoformat())
        await original(key_id, minute)

    monkeypatch.setattr(store, "touch_used", counting)
    clock.now = clock.now.replace(second=1)
    for _ in range(5):
        await assert_ok(await client.get(url(admin), headers=admin.headers))
    assert len(writes) == 1
    clock.advance(minutes=1)
    result = await assert_ok(await client.get(url(admin), headers=admin.headers))
    assert len(writes) == 2
    assert result["usedAt"] == clock.now.strftime("%Y-%m-%dT%H:%M:00Z")


def test_parse_basic() -> None:
    assert parse_basic(f"Basic {b64(b'id:se:cret')}") == ("id", "se:cret")
    assert parse_basic(f"basic {b64(b'id:s')}") == ("id", "s")
    assert parse_basic(f"Digest {b64(b'id:s')}") is None


@pytest.mark.parametrize(
    ("granted", "needed", "allowed"),
    [
        (["*"], "keys:create", True),
        (["keys:read"], "keys:read", True),
        (["keys:read"], "keys:create", False),
        (["keys:*"], "keys:delete", True),
        (["roles:*"], "keys:read", False),
        ([], "keys:read", False),
        (["keys:reader", "key:*", "keys"], "keys:read", False),
    ],
)
@pytest.mark.parametrize("kind", [list, frozenset])
def test_has_permission(granted: list[str], needed: str, allowed: bool, kind: type) -> None:
    assert has_permission(kind(granted), needed) is allowed


# The modules whose compares authenticate a request.
AUTHENTICATING = {"keysvc.http.auth", "keysvc.credentials", "keysvc.db.cache"}


class Work:
    """Counts the hashing and comparing authentication does, through the real code."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, client: Client) -> None:
        self.hashes = 0
        self.compares = 0
        self.lookups = 0
        keyed, of_header, compare = Hasher.keyed, Hasher.of_header, hmac.compare_digest
        store = client.app[STORE]
        find = store.caches.cached_credential  # every lookup starts here; a miss reads the database
        proven = store.caches.proven_credential  # the header's proof, looked up first

        def counting_keyed(hasher: Hasher, value: str) -> bytes:
            self.hashes += 1
            return keyed(hasher, value)

        def counting_of_header(hasher: Hasher, header: str) -> bytes:
            self.hashes += 1
            return of_header(hasher, header)

        def counting_proven(proof: bytes):  # type: ignore[no-untyped-def]
            self.lookups += 1
            return proven(proof)

        def counting_compare(a: bytes, b: bytes) -> bool:
            # Authentication's compares only: on PostgreSQL, a peer's acknowledgement
            # arriving meanwhile is checked too (keysvc.db.postgres.peers).
            if sys._getframe(1).f_globals["__name__"] in AUTHENTICATING:
                self.compares += 1
            return compare(a, b)

        def counting_find(key_id_hash: bytes):  # type: ignore[no-untyped-def]
            self.lookups += 1
            return find(key_id_hash)

        monkeypatch.setattr(Hasher, "keyed", counting_keyed)
        monkeypatch.setattr(hmac, "compare_digest", counting_compare)
        monkeypatch.setattr(store.caches, "cached_credential", counting_find)
        monkeypatch.setattr(Hasher, "of_header", counting_of_header)
        monkeypatch.setattr(store.caches, "proven_credential", counting_proven)

    def take(self) -> tuple[int, int, int]:
        taken = (self.hashes, self.compares, self.lookups)
        self.hashes = self.compares = self.lookups = 0
        return taken


@pytest.mark.parametrize("path", ["/v1/whoami", "/v1/verify"])
async def test_unknown_key_and_wrong_secret_do_the_same_work(
    client: Client, admin: Creds, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """Structural, not timed: the same number of keyed hashes, constant-time compares,
    cache lookups and database reads, whether the key ID is unknown or the secret is
    wrong, with the key's record cached or not. The read is that of an uncached key
    (its row joined with its roles'): a cached key runs it too, as docs/SECURITY.md
    says."""
    other = await create_creds(client, admin, {"name": "other", "roles": ["developer"]})
    gone = await create_creds(client, admin, {"name": "gone", "roles": ["developer"]})
    gone_path = f"/v1/organizations/{admin.organization_id}/keys/{gone.id}"
    await assert_ok(await client.delete(gone_path, headers=admin.headers))
    work = Work(monkeypatch, client)
    reads = count_reads(client.app[STORE], monkeypatch)

    async def refused(headers: dict[str, str]) -> tuple[int, int, int]:
        reads.clear()
        await assert_error(await client.get(path, headers=headers), 401, UNAUTHORIZED)
        return work.take()

    unknown = await refused(basic("A" * 20, new_secret()))
    unknown_reads = list(reads)
    uncached = await refused(basic(other.key_id, new_secret()))
    uncached_reads = list(reads)
    await assert_ok(await client.get("/v1/whoami", headers=other.headers))
    work.take()
    cached = await refused(basic(other.key_id, new_secret()))
    cached_reads = list(reads)
    unknown_again = await refused(basic("B" * 20, other.secret))
    # A deleted key's tombstone, with its own secret (a use to log) or a wrong one.
    deleted = await refused(gone.headers)
    deleted_reads = list(reads)
    deleted_wrong = await refused(basic(gone.key_id, new_secret()))
    # The same statement each time: the key's row by key-ID hash, with its roles.
    assert len(uncached_reads) == 1
    assert unknown_reads == uncached_reads == cached_reads == deleted_reads == reads
    # Three keyed hashes (the header's proof, key ID, secret); two compares (the
    # checksum, the secret); two lookups (the proof, never found; the key ID).
    assert unknown == uncached == cached == unknown_again == (3, 2, 2)
    assert deleted == deleted_wrong == (3, 2, 2)


def test_generated_characters_are_uniform_base62() -> None:
    """720,000 draws: every base62 character, each within 6% of its share (about 6.5
    standard deviations), so a biased mapping such as byte % 62 over all 256 fails."""
    drawn = Counter("".join(new_secret()[len(SECRET_PREFIX) : -6] for _ in range(20_000)))
    assert set(drawn) == set(BASE62)
    share = 20_000 * 36 / 62
    assert all(abs(count - share) < 0.06 * share for count in drawn.values()), drawn
