"""Issuing keys: credentials chosen (generated, or the client's own through
``hashData``), hashed, and stored with their roles in one transaction."""

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from keysvc.credentials import SUFFIX_LENGTH, Hasher, new_key_id, new_secret, sha256_b64
from keysvc.store import Key, NewKey, Organization, Store


@dataclass(frozen=True)
class Issued:
    """A stored key, and its credentials when keysvc generated them (shown once)."""

    key: Key
    key_id: str | None = None
    secret: str | None = None


def _new_key(
    hasher: Hasher, organization_id: str, data: dict[str, Any], now: datetime
) -> tuple[NewKey, str | None, str | None]:
    hash_data = data.get("hashData")
    if hash_data is not None:
        key_id = secret = None
        id_hash, secret_hash = hash_data["keyIdHash"], hash_data["keySecretHash"]
        suffix = hash_data["keyIdSuffix"]
    else:
        key_id, secret = new_key_id(), new_secret()
        id_hash, secret_hash = sha256_b64(key_id), sha256_b64(secret)
        suffix = key_id[-SUFFIX_LENGTH:]
    new = NewKey(
        organization_id=organization_id,
        name=data["name"],
        state=data.get("state", "enabled"),
        key_id_hash=hasher.keyed(id_hash),
        secret_hash=hasher.keyed(secret_hash),
        key_suffix=suffix,
        created_at=now,
        expire_at=data.get("expireAt"),
        ip_access_list=data.get("ipAccessList") or [],
        role_names=data.get("roles") or (),
        role_ids=[str(role_id) for role_id in data.get("assignedRoleIds") or ()],
    )
    return new, key_id, secret


async def create_key(
    store: Store, hasher: Hasher, organization_id: str, data: dict[str, Any], now: datetime
) -> Issued:
    """Store a key from a validated create body."""
    new, key_id, secret = _new_key(hasher, organization_id, data, now)
    return Issued(await store.create_key(new), key_id, secret)


async def bootstrap(
    store: Store, hasher: Hasher, org_name: str, now: datetime
) -> tuple[Organization, Issued]:
    """A new organization with a first ``admin`` key: the stand-in for a console."""
    data = {"name": f"{org_name} admin", "roles": ["admin"]}
    new, key_id, secret = _new_key(hasher, "", data, now)
    org, key = await store.bootstrap(org_name, new)
    return org, Issued(key, key_id, secret)
