"""A key's public view: the ApiKey object of the API document, as a dict.

It is what a key answer says (``keysvc.http.render`` writes it as JSON on the hot
paths) and the data of every key event a webhook is sent (``keysvc.domain.webhooks``),
so the layers that need it, the domain's writes and the delivery task among them,
find it here in the kernel. ``responses.ApiKeySchema`` stays the contract, and
tests/api/test_views.py holds the two together.
"""

import json
from typing import Any

from keysvc.models import Credits, Key
from keysvc.timeutil import to_text


def api_key(key: Key) -> dict[str, Any]:
    """The ApiKey object of the API document."""
    out: dict[str, Any] = {
        "id": key.id,
        "name": key.name,
        "state": key.state,
        "roles": [role.name for role in key.roles if role.type == "system"],
        "assignedRoles": [
            {"roleId": role.id, "roleName": role.name, "roleType": role.type} for role in key.roles
        ],
        "keySuffix": key.key_suffix,
        "createdAt": to_text(key.created_at),
        "expireAt": None if key.expire_at is None else to_text(key.expire_at),
    }
    # usedAt is absent, not null, until the key is first used; rateLimit when unset.
    if key.used_at is not None:
        out["usedAt"] = to_text(key.used_at)
    out["ipAccessList"] = [_ip_entry(entry) for entry in key.ip_access_list]
    if key.rate_limit is not None:
        out["rateLimit"] = {"limit": key.rate_limit[0], "windowSeconds": key.rate_limit[1]}
    if key.previous_until is not None:
        out["previousCredentialExpiresAt"] = to_text(key.previous_until)
    out.update(details(key))
    return out


def details(key: Key) -> dict[str, Any]:
    """Issue 29's fields of a key, each absent when unset (as rateLimit): externalId,
    meta and credits (absent: unlimited)."""
    out: dict[str, Any] = {}
    if key.external_id is not None:
        out["externalId"] = key.external_id
    if key.meta is not None:
        out["meta"] = key.meta
    if key.credits is not None:
        out["credits"] = credits_json(key.credits)
    if key.ratelimits is not None:  # issue 36: stored as their wire entries
        out["ratelimits"] = json.loads(key.ratelimits)
    return out


def credits_json(credits: Credits | None) -> dict[str, Any] | None:
    """A key's public ``credits`` object as stored: remaining, refill, nextRefillAt."""
    if credits is None:
        return None
    refill, due = credits.refill, credits.next_refill_at
    return {
        "remaining": credits.remaining,
        "refill": None
        if refill is None
        else {"interval": refill.interval, "amount": refill.amount, "refillDay": refill.day},
        "nextRefillAt": None if due is None else to_text(due),
    }


def _ip_entry(entry: dict[str, str]) -> dict[str, str]:
    out = {"source": entry["source"]}
    if "description" in entry:
        out["description"] = entry["description"]
    return out
