"""The caches of committed data, and their one owner (``Caches``): credentials by key-ID
hash and by key UUID, proven Authorization headers, and rendered list pages.
Credentials are dropped whole when the authorization generation moves; a key by UUID
and a list page are served only at the ``data_version`` they were read at. The cache
never decides an answer: the secret and expiry are checked on every request. Why it is
safe, rotation included: docs/SECURITY.md, "The credential cache".
"""

import asyncio
import hmac
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, replace
from typing import Generic, Protocol, TypeVar

from keysvc.models import Credential, Key

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Versions(Protocol):
    """What the caches are kept fresh against (SQLite's ``Freshness``, PostgreSQL's
    ``Notifications``): a number that moves with every commit, and the authorization
    generation as of its last look."""

    generation: object

    def look(self) -> int: ...


@dataclass(frozen=True)
class Entry:
    credential: Credential
    data_version: int


class CredentialCache:
    def __init__(self, max_entries: int):
        self._max = max_entries
        self._by_hash: OrderedDict[bytes, Entry] = OrderedDict()
        # A key's cached key-ID hashes: its current one, and its previous one's.
        self._hashes_of_id: dict[str, set[bytes]] = {}
        # Proofs: the keyed hash of a whole Authorization header whose credentials were
        # checked, with the key-ID hash and secret hash it was found to carry (see proven).
        self._proofs: OrderedDict[bytes, tuple[bytes, bytes]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._by_hash)

    def get(self, key_id_hash: bytes) -> Entry | None:
        entry = self._by_hash.get(key_id_hash)
        if entry is not None:
            self._by_hash.move_to_end(key_id_hash)
        return entry

    def by_key(self, key_uuid: str) -> Entry | None:
        hashes = self._hashes_of_id.get(key_uuid)
        # Either entry: a reader serves it only at the data_version it was read at.
        return self._by_hash.get(next(iter(hashes))) if hashes else None

    def put(self, key_id_hash: bytes, credential: Credential, data_version: int) -> None:
        if self._max <= 0:
            return
        self._by_hash[key_id_hash] = Entry(credential, data_version)
        self._by_hash.move_to_end(key_id_hash)
        self._hashes_of_id.setdefault(credential.key.id, set()).add(key_id_hash)
        while len(self._by_hash) > self._max:
            dropped, oldest = self._by_hash.popitem(last=False)
            hashes = self._hashes_of_id.get(oldest.credential.key.id)
            if hashes is not None:
                hashes.discard(dropped)
                if not hashes:
                    del self._hashes_of_id[oldest.credential.key.id]

    def refresh(self, key: Key, data_version: int) -> None:
        """Replace a cached key's record with a newer read, in each of its entries, if it
        is cached. Each entry keeps its own secret hash and end: a newer read at the same
        authorization generation changed neither."""
        for key_id_hash in self._hashes_of_id.get(key.id, ()):
            entry = self._by_hash.get(key_id_hash)
            if entry is not None:
                self._by_hash[key_id_hash] = Entry(replace(entry.credential, key=key), data_version)

    def proven(self, proof: bytes) -> Credential | None:
        """The cached credential that the header hashed to ``proof`` was shown to carry,
        while that key is still cached with the secret hash it was shown to match.

        A header is remembered (``prove``) only after its key ID and secret were hashed
        and its secret hash compared, so the same header carries the same secret: one
        keyed hash of the header stands in for parsing it and hashing both parts. A
        different secret hash for that key, or its entry dropped (as every write that
        can change an answer drops it), leaves the proof unmatched; a refreshed
        record with the same secret (a new usedAt, say) keeps it.
        """
        seen = self._proofs.get(proof)
        if seen is None:
            return None
        entry = self._by_hash.get(seen[0])
        if entry is None or not hmac.compare_digest(entry.credential.secret_hash, seen[1]):
            return None
        self._by_hash.move_to_end(seen[0])
        self._proofs.move_to_end(proof)
        return entry.credential

    def prove(self, proof: bytes, key_id_hash: bytes, credential: Credential) -> None:
        """Remember that ``proof``'s header carries ``credential``'s key ID and secret."""
        if self._max <= 0:
            return
        self._proofs[proof] = (key_id_hash, credential.secret_hash)
        self._proofs.move_to_end(proof)
        while len(self._proofs) > self._max:
            self._proofs.popitem(last=False)  # the least recently used

    def clear(self) -> None:
        self._by_hash.clear()
        self._hashes_of_id.clear()
        self._proofs.clear()


class VersionedCache(Generic[K, V]):
    """A small LRU of values, each good only at the ``data_version`` it was made at.

    For answers that depend on nothing but committed data (a page of keys, say):
    a value is returned only while no connection, in any process, has committed
    since, so it is exactly what reading again would give.
    """

    def __init__(self, max_entries: int):
        self._max = max_entries
        self._entries: OrderedDict[K, tuple[int, V]] = OrderedDict()
        # Values being made, by (key, data_version): one making serves every request
        # that asks meanwhile, as at the turn of a minute, when all of them miss at once.
        self._making: dict[tuple[K, int], asyncio.Future[V]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K, data_version: int) -> V | None:
        found = self._entries.get(key)
        if found is None or found[0] != data_version:
            return None
        self._entries.move_to_end(key)
        return found[1]

    def put(self, key: K, data_version: int, value: V) -> None:
        if self._max <= 0:
            return
        self._entries[key] = (data_version, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)

    async def get_or_make(self, key: K, data_version: int, make: Callable[[], Awaitable[V]]) -> V:
        """The value kept for ``key`` at ``data_version``, else ``make()``'s, kept.

        ``data_version`` must be read before ``make`` reads anything, so that a commit
        in between can only make the kept value look older than it is, never newer.
        """
        found = self.get(key, data_version)
        if found is not None:
            return found
        making = self._making.get((key, data_version))
        if making is None:
            making = asyncio.ensure_future(make())
            self._making[(key, data_version)] = making
            making.add_done_callback(lambda done: self._made(key, data_version, done))
        # Shielded: a caller that goes away does not cancel it for the others.
        return await asyncio.shield(making)

    def _made(self, key: K, data_version: int, done: "asyncio.Future[V]") -> None:
        del self._making[(key, data_version)]
        if not done.cancelled() and done.exception() is None:
            self.put(key, data_version, done.result())

    def clear(self) -> None:
        self._entries.clear()


# Rendered list pages kept (each up to the page limit of keys, ~0.4 KiB a key).
PAGE_CACHE_ENTRIES = 32


@dataclass(frozen=True)
class IdentityFacts:
    """What a verify needs of a key's identity: its UUID, whether it has credits (how
    many is the database's), and its named rate limits in their stored form."""

    id: str
    has_credits: bool
    ratelimits: str | None


class Caches:
    """Every cache of committed data, kept fresh against ``Versions``."""

    def __init__(self, freshness: Versions, cache_size: int):
        self._freshness = freshness
        self.credentials = CredentialCache(cache_size)
        # Rendered answers that depend only on committed data (see data_version).
        self._pages: VersionedCache[tuple[object, ...], tuple[bytes, bytes]] = VersionedCache(
            PAGE_CACHE_ENTRIES if cache_size > 0 else 0
        )
        self._seen_generation: object = None
        # Issue 36: by (organization, externalId), what a verify needs of its keys'
        # identity (``IdentityFacts``), or None without one: dropped with the
        # credentials, as a change to whether it has credits or to its limits moves
        # the generation. One read fills it for both.
        self.identities: dict[tuple[str, str], IdentityFacts | None] = {}

    def data_version(self) -> int:
        """A number that changes whenever anything is committed, by any connection in
        any process: what was read at one value is still current while it holds.
        Drops the credentials first if authorization has moved since the last look."""
        version = self._freshness.look()
        generation = self._freshness.generation
        if generation != self._seen_generation:
            self.credentials.clear()
            self.identities.clear()
            self._seen_generation = generation
        return version

    async def page(
        self, key: tuple[object, ...], render: Callable[[], Awaitable[tuple[bytes, bytes]]]
    ) -> tuple[bytes, bytes]:
        """The page rendered for ``key`` as committed now: kept, else ``render()``'s.

        The version is read before the page: a commit in between makes the kept page
        look older than it is, so the next request renders it again.
        """
        return await self._pages.get_or_make(key, self.data_version(), render)

    def pages_kept(self) -> int:
        return len(self._pages)

    @property
    def generation(self) -> object:
        """The authorization generation as of the last ``data_version``."""
        return self._seen_generation

    def unchanged_since(self, generation: object) -> bool:
        """Whether authorization is still at ``generation``, as seen before some reads
        that awaited: only then may what they read be cached. A commit meanwhile (here
        or in another process) may have dropped the cache already, and a record read
        before it would otherwise be kept, and trusted, until the next such commit."""
        self.data_version()
        return self._seen_generation == generation

    def authorization_changed(self) -> None:
        """This process committed a change to what some key may do."""
        self.credentials.clear()
        self.identities.clear()

    def cached_key(self, organization_id: str, key_id: str) -> Key | None:
        """The key as committed now, if it is cached and nothing at all was committed
        since it was read; no statement runs."""
        version = self.data_version()
        entry = self.credentials.by_key(key_id)
        if (
            entry is not None
            and entry.data_version == version
            and entry.credential.key.organization_id == organization_id
        ):
            return entry.credential.key
        return None

    def cached_credential(self, key_id_hash: bytes) -> Credential | None:
        """The credential, if it is cached and authorization has not moved since; no
        statement runs."""
        self.data_version()
        entry = self.credentials.get(key_id_hash)
        return entry.credential if entry is not None else None

    def proven_credential(self, proof: bytes) -> Credential | None:
        """The credential a checked Authorization header carries, found by the header's
        keyed hash (``CredentialCache.proven``), if authorization has not moved since."""
        self.data_version()
        return self.credentials.proven(proof)

    def remember_proof(self, proof: bytes, key_id_hash: bytes, credential: Credential) -> None:
        """Remember that the header hashed to ``proof`` carries ``credential``'s
        key ID (hashed to ``key_id_hash``) and its secret."""
        self.credentials.prove(proof, key_id_hash, credential)

    def keep_credential(
        self, key_id_hash: bytes, credential: Credential, version: int, generation: object
    ) -> None:
        """Keep a credential read at ``version`` and ``generation``, unless authorization
        moved while it was read."""
        if self.unchanged_since(generation):
            self.credentials.put(key_id_hash, credential, version)

    def refresh_key(self, key: Key, version: int, generation: object) -> None:
        """As ``keep_credential``, for a key read by its UUID (its entries, if cached)."""
        if self.unchanged_since(generation):
            self.credentials.refresh(key, version)
