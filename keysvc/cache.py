"""A bounded cache of credentials, so the hot path skips the database.

Entries are keyed by the keyed hash of the key ID, the same value the database
is searched by. The cache never decides an answer: the secret is checked on
every request against the cached keyed hash, and expiry against the clock.
It only saves the round trip, and the store drops it whole whenever the
authorization generation moves (see ``Store``).

Each entry remembers the database's ``data_version`` it was read at, so a
reader that needs the very latest row (``usedAt`` included) can tell whether
anything at all was committed since.
"""

from collections import OrderedDict
from dataclasses import dataclass

from keysvc.models import Credential


@dataclass(frozen=True)
class Entry:
    credential: Credential
    data_version: int


class CredentialCache:
    def __init__(self, max_entries: int):
        self._max = max_entries
        self._by_hash: OrderedDict[bytes, Entry] = OrderedDict()
        self._hash_of_id: dict[str, bytes] = {}

    def __len__(self) -> int:
        return len(self._by_hash)

    def get(self, key_id_hash: bytes) -> Entry | None:
        entry = self._by_hash.get(key_id_hash)
        if entry is not None:
            self._by_hash.move_to_end(key_id_hash)
        return entry

    def by_key(self, key_uuid: str) -> Entry | None:
        key_id_hash = self._hash_of_id.get(key_uuid)
        return None if key_id_hash is None else self._by_hash.get(key_id_hash)

    def put(self, key_id_hash: bytes, credential: Credential, data_version: int) -> None:
        if self._max <= 0:
            return
        self._by_hash[key_id_hash] = Entry(credential, data_version)
        self._by_hash.move_to_end(key_id_hash)
        self._hash_of_id[credential.key.id] = key_id_hash
        while len(self._by_hash) > self._max:
            _, oldest = self._by_hash.popitem(last=False)
            self._hash_of_id.pop(oldest.credential.key.id, None)

    def refresh(self, credential: Credential, data_version: int) -> None:
        """Replace a cached key's record with a newer read, if it is cached."""
        key_id_hash = self._hash_of_id.get(credential.key.id)
        if key_id_hash is not None and key_id_hash in self._by_hash:
            self._by_hash[key_id_hash] = Entry(credential, data_version)

    def clear(self) -> None:
        self._by_hash.clear()
        self._hash_of_id.clear()
