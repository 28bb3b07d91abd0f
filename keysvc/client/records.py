"""The client's results that are more than the envelope's ``result``: a page of a list
(``Page``), a key with its ETag (``Tagged``), and the caller a verify answer names
(``Caller``), read from verify's headers or its JSON answer."""

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

JsonObject = dict[str, Any]


@dataclass(frozen=True)
class Page:
    """One page of a list: its items, the cursor of the next (None on the last) and
    the list's total."""

    items: list[JsonObject]
    next_cursor: str | None
    total_count: int | None


@dataclass(frozen=True)
class Tagged:
    """A resource and its ETag, for a later If-Match."""

    value: JsonObject
    etag: str | None


@dataclass(frozen=True)
class Caller:
    """Who a verified request comes from. ``name`` and ``meta`` come with verify's JSON
    answer only; ``identity`` stays None until keysvc has identities. ``permissions``
    from the headers may end with an entry such as ``+12 more`` (keysvc bounds the
    header): it matches no permission, so a check against it fails closed."""

    key_id: str
    organization_id: str
    permissions: frozenset[str]
    external_id: str | None = None
    credits_remaining: int | None = None
    name: str | None = None
    meta: JsonObject | None = field(default=None, hash=False)
    identity: JsonObject | None = field(default=None, hash=False)

    def may(self, permission: str) -> bool:
        """Whether the key holds ``permission``: itself, ``*``, or its namespace's
        ``ns:*`` (keysvc's rule, keysvc.domain.permissions.has_permission)."""
        held = self.permissions
        return permission in held or "*" in held or f"{permission.partition(':')[0]}:*" in held


def caller_from_headers(headers: Mapping[str, str]) -> Caller:
    return _caller(
        headers["X-Key-Id"],
        headers["X-Organization-Id"],
        headers.get("X-Key-Permissions", ""),
        headers.get("X-Key-External-Id"),  # percent-encoded UTF-8
        headers.get("X-Credits-Remaining"),
    )


@functools.lru_cache(maxsize=4096)
def _caller(
    key_id: str, organization_id: str, listed: str, external_id: str | None, remaining: str | None
) -> Caller:
    """The caller these header values name. Kept by value: keysvc names the same key
    with the same values on every verify until it changes, and a ``Caller`` is frozen,
    so one is as good as another (making one costs more than a verify's other reading)."""
    return Caller(
        key_id=key_id,
        organization_id=organization_id,
        permissions=frozenset(p for p in listed.split(",") if p),
        external_id=None if external_id is None else unquote(external_id),
        credits_remaining=int(remaining) if remaining is not None else None,
    )


def caller_from_json(result: JsonObject) -> Caller:
    credits = result.get("credits")
    return Caller(
        key_id=result["keyId"],
        organization_id=result["organizationId"],
        permissions=frozenset(result.get("permissions", ())),
        external_id=result.get("externalId"),
        credits_remaining=credits["remaining"] if credits else None,
        name=result.get("name"),
        meta=result.get("meta"),
    )
