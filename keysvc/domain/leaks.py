"""Leaked secrets: what a report that a key's secret leaked does, whoever makes it
(revoke-by-secret over the API, ``keysvc revoke-leaked``, GitHub's secret scanning).

Holding the secret is the authority: the key is found by the secret alone
(``Store.keys_with_secret``: its current secret, or a rotation's previous one while its
grace lasts, which still opens the key). Under the ``disable`` action (the default,
``KEYSVC_LEAKED_KEY_ACTION``) an enabled key is disabled the way a PATCH disables it:
its state-changed activity and ``key.updated`` event, the authorization generation
moved so that every credential cache drops it, on both backends, before the answer.
Under ``notify`` the key is left as it is. Either way, in the same transaction, a
``key_leaked`` activity records who reported it and where it was found, and the
``key.leaked`` event is sent. A report of a secret already reported for that key
changes and records nothing: GitHub reports a token again for each place it finds it.
Like any write, a report is refused (429) while the key's organization is past its
write budget or a subscribed webhook's queue is full (``keysvc.db.quota``).
"""

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from keysvc.credentials import Hasher
from keysvc.db import keys as key_sql
from keysvc.db.contract import Connection, SecretHolder, Store
from keysvc.domain import activities
from keysvc.domain.keys import announce_change
from keysvc.keyview import api_key
from keysvc.models import Actor, KeyChange

DISABLE = "disable"  # else "notify": KEYSVC_LEAKED_KEY_ACTION (keysvc.settingvalues)
KEY_LEAKED_EVENT = "key.leaked"
# Who reported a leak, as its activity says.
REVOKE_LEAKED, CLI, GITHUB = "revoke-leaked", "cli", "github"
# The actor of a report from the command line.
CLI_ACTOR = Actor("system", details="keysvc revoke-leaked")


@dataclass(frozen=True)
class Report:
    """Who reports a leak and what they say of it: ``reporter`` (REVOKE_LEAKED, CLI or
    GITHUB), the actor its activities are recorded as, and GitHub's ``url``, ``source``
    and token ``type`` when it sent them. Never the secret."""

    reporter: str
    actor: Actor
    url: str | None = None
    source: str | None = None
    token_type: str | None = None


async def report_leak(
    store: Store, hasher: Hasher, secret: str, report: Report, action: str, now: datetime
) -> bool:
    """Act on the report that ``secret`` leaked, in one transaction; whether it is the
    secret of some key (current, or previous within its grace), reported before or not.
    The caller must not tell its client which: the answer is the same either way."""
    secret_hash = hasher.of_plain(secret)
    async with store.transaction("report_leak") as conn:
        holders = await store.keys_with_secret(conn, secret_hash, now)
        for holder in holders:
            if not holder.reported:
                await _act(store, conn, holder, secret_hash, report, action, now)
    return bool(holders)


async def _act(
    store: Store,
    conn: Connection,
    holder: SecretHolder,
    secret_hash: bytes,
    report: Report,
    action: str,
    now: datetime,
) -> None:
    key = holder.key
    done = "notified"
    if action == DISABLE and key.state == "enabled":
        await key_sql.update_key(conn, key, KeyChange(state="disabled"))
        disabled = await key_sql.get_key(conn, key.organization_id, key.id)
        assert disabled is not None
        await store.authorization_changed(conn)
        logged = activities.key_changed(key, disabled, report.actor, now)
        await announce_change(store, conn, disabled, logged, now)
        key, done = disabled, "disabled"
    elif key.state != "enabled":
        done = "already disabled"
    await key_sql.mark_leaked(conn, key.id, secret_hash, now)
    details = _details(report, done, holder)
    await store.record(conn, activities.key_leaked(key, report.actor, now, details))
    await store.enqueue(conn, key.organization_id, KEY_LEAKED_EVENT, api_key(key), now)


def _details(report: Report, done: str, holder: SecretHolder) -> dict[str, Any]:
    """What the ``key_leaked`` activity keeps of the report."""
    details: dict[str, Any] = {
        "reporter": report.reporter,
        "action": done,
        "credential": "previous" if holder.previous else "current",
    }
    given = (("url", report.url), ("source", report.source), ("tokenType", report.token_type))
    for name, value in given:
        if value is not None:
            details[name] = value
    return details
