"""The operator's commands on keys, run on the store without serving: ``bootstrap``,
``admin-key`` (the way back in when every admin secret is lost, logged as a ``system``
activity) and ``revoke-leaked``, which reads the leaked secret from standard input,
never from an argument, which every user of the machine can read in ``ps``
(``keysvc.domain.leaks``)."""

import asyncio
from typing import IO

from keysvc.config import ConfigError, Settings
from keysvc.db.backends import open_store
from keysvc.domain import keys, leaks
from keysvc.domain.limits import MAX_LEAKED_SECRET
from keysvc.http.render import STORE_RECORDS
from keysvc.http.schemas import CreateKeySchema, load
from keysvc.timeutil import utcnow

STDIN_ONLY = "revoke-leaked: give the secret on standard input, one line (not as an argument)"


def _shown(issued: keys.Issued) -> dict[str, str]:
    """A generated key as bootstrap and admin-key print it, its secret shown once."""
    assert issued.key_id is not None and issued.secret is not None
    return {
        "organizationId": issued.key.organization_id,
        "id": issued.key.id,
        "keyId": issued.key_id,
        "keySecret": issued.secret,
    }


def bootstrap(settings: Settings, org_name: str, if_empty: bool) -> dict[str, str] | None:
    """An organization and its first admin key; None when ``if_empty`` and the database
    has an organization already."""
    return asyncio.run(_bootstrap(settings, org_name, if_empty))


async def _bootstrap(settings: Settings, org_name: str, if_empty: bool) -> dict[str, str] | None:
    async with open_store(settings, records=STORE_RECORDS) as (store, hasher):
        if if_empty and await store.has_organization():
            return None
        _, issued = await keys.bootstrap(store, hasher, org_name, utcnow())
    return _shown(issued)


def admin_key(settings: Settings, org: str | None, name: str) -> dict[str, str]:
    return asyncio.run(_admin_key(settings, org, name))


async def _admin_key(settings: Settings, org: str | None, name: str) -> dict[str, str]:
    async with open_store(settings, create=False, records=STORE_RECORDS) as (store, hasher):
        now = utcnow()
        # Checked by the create schema's rules for a name, as any created key's is.
        name = load(CreateKeySchema(now=now), {"name": name, "roles": ["admin"]})["name"]
        issued = await keys.admin_key(store, hasher, org, name, now, settings.max_keys_per_org)
    return _shown(issued)


def read_secret(stream: IO[str]) -> str:
    """The secret on ``stream``'s first line, without its line end and surrounding blanks;
    ConfigError when there is none or it is longer than any secret keysvc takes."""
    secret = stream.readline(MAX_LEAKED_SECRET + 2).strip()
    if not secret:
        raise ConfigError(STDIN_ONLY)
    if len(secret) > MAX_LEAKED_SECRET:
        raise ConfigError(f"revoke-leaked: the secret is over {MAX_LEAKED_SECRET} characters")
    return secret


def revoke_leaked(settings: Settings, secret: str) -> dict[str, bool]:
    """Report ``secret`` leaked as the operator (``keysvc.domain.leaks.CLI_ACTOR``); the
    operator, who holds the database, is told whether it was some key's."""
    return asyncio.run(_revoke_leaked(settings, secret))


async def _revoke_leaked(settings: Settings, secret: str) -> dict[str, bool]:
    async with open_store(settings, create=False, records=STORE_RECORDS) as (store, hasher):
        report = leaks.Report(leaks.CLI, leaks.CLI_ACTOR)
        action = settings.leaked_key_action
        matched = await leaks.report_leak(store, hasher, secret, report, action, utcnow())
    return {"matched": matched}
