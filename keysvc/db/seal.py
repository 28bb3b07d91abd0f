"""The outbox rows' MAC (``Seal``): keyed from the pepper, written with each delivery row
in its event's transaction, and checked by delivery just before it signs, so a row
written or changed by hand is never sent."""

import hashlib
import hmac
import json
from typing import Protocol


class SealedRow(Protocol):
    """What a delivery row's MAC covers (``keysvc.db.outbox.Due`` is one)."""

    @property
    def id(self) -> str: ...
    @property
    def webhook_id(self) -> str: ...
    @property
    def organization_id(self) -> str: ...
    @property
    def url(self) -> str: ...
    @property
    def event_id(self) -> str: ...
    @property
    def event_type(self) -> str: ...
    @property
    def body(self) -> str: ...
    @property
    def mac(self) -> bytes | None: ...


class Seal:
    """The key outbox rows are MACed with, derived from the pepper; set once the pepper
    is known (``Store.key_outbox``), as the activity chain's is."""

    def __init__(self, key: bytes | None = None):
        self._key = key

    def keyed(self, key: bytes) -> None:
        self._key = key

    @property
    def is_keyed(self) -> bool:
        return self._key is not None

    def of(self, delivery_id: str, webhook_id: str, organization_id: str, url: str,
           event_id: str, event_type: str, body: str) -> bytes:  # fmt: skip
        """The MAC of a delivery row: over a JSON array of what its attempt sends, and
        where, so that no field can run into the next."""
        if self._key is None:
            raise RuntimeError("the outbox has no key: the pepper was not loaded")
        fields = [delivery_id, webhook_id, organization_id, url, event_id, event_type, body]
        text = json.dumps(fields, ensure_ascii=True, separators=(",", ":"))
        return hmac.new(self._key, b"delivery\0" + text.encode(), hashlib.sha256).digest()

    def verifies(self, due: SealedRow) -> bool:
        """Whether ``due``'s MAC is the one keysvc wrote for it, to its webhook as it is."""
        if due.mac is None:
            return False
        expected = self.of(due.id, due.webhook_id, due.organization_id, due.url,
                           due.event_id, due.event_type, due.body)  # fmt: skip
        return hmac.compare_digest(expected, bytes(due.mac))
