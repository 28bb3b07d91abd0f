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
A report is a revocation: never refused for the key's organization's write budget or
a webhook's full queue (``keysvc.db.quota``), so that nothing the leaked key wrote can
delay its end; and each token of a report is acted on alone (``report_each``).
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from keysvc.credentials import Hasher
from keysvc.db import keys as key_sql
from keysvc.db.contract import Connection, SecretHolder, Store
from keysvc.domain import activities
from keysvc.domain.keys import announce_change
from keysvc.errors import ApiError, ServiceUnavailable
from keysvc.keyview import api_key
from keysvc.models import Actor, KeyChange

logger = logging.getLogger("keysvc")

DISABLE = "disable"  # else "notify": KEYSVC_LEAKED_KEY_ACTION (keysvc.settingvalues)
KEY_LEAKED_EVENT = "key.leaked"
# Who reported a leak, as its activity says.
REVOKE_LEAKED, CLI, GITHUB = "revoke-leaked", "cli", "github"
# The actor of a report from the command line.
CLI_ACTOR = Actor("system", details="keysvc revoke-leaked")


# Revoke-by-secret reports that may wait for their work at once; past it, 503 for
# every report alike, hit or miss, so that none is lost unanswered.
MAX_WAITING = 1000
BUSY = "too many leak reports are waiting to be acted on; send the report again shortly"
BUSY_RETRY_AFTER = 5


class Waiting:
    """Revoke-by-secret reports acted on after their answer: the answer, its headers
    and its time are then the same for a hit as for a miss, whatever the work a hit
    causes. At most ``limit`` wait at once (ServiceUnavailable past it, before any
    work); each runs as its own task, its failure logged; ``drain`` waits for them all
    (at shutdown, before the store closes, so that none is lost)."""

    def __init__(self, limit: int = MAX_WAITING) -> None:
        self.limit = limit
        self._tasks: set[asyncio.Task[None]] = set()

    def submit(self, work: Callable[[], Awaitable[object]]) -> None:
        if len(self._tasks) >= self.limit:
            raise ServiceUnavailable(BUSY, headers={"Retry-After": str(BUSY_RETRY_AFTER)})
        task = asyncio.create_task(self._run(work), name="keysvc-leak-report")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _run(work: Callable[[], Awaitable[object]]) -> None:
        try:
            await work()
        except Exception:  # the reporter has its answer: the operator gets the line
            logger.exception("a leak report could not be acted on")

    async def drain(self) -> None:
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


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
    """Act on the report that ``secret`` leaked; whether it is the secret of some key
    (current, or previous within its grace), reported before or not. The caller must not
    tell its client which: the answer is the same either way. Each key is acted on once,
    however many of its credentials answer to the secret; keys not reported yet are read
    first, ``LEAKED_KEYS_READ`` a transaction, until none is left, so that every key a
    hashData client gave this secret is reached. The secret is trimmed of surrounding
    whitespace first."""
    # Surrounding blanks are never part of a secret keysvc makes; a pasted line end would
    # otherwise revoke nothing. Trimmed here, the API, the CLI and GitHub's reports agree.
    secret_hash = hasher.of_plain(secret.strip())
    matched = False
    while True:
        # Untimed: its duration in /metrics would tell a hit from a miss.
        async with store.transaction("report_leak", timed=False) as conn:
            holders = await store.keys_with_secret(conn, secret_hash, now)
            matched = matched or bool(holders)
            acted: set[str] = set()
            for holder in holders:
                if not holder.reported and holder.key.id not in acted:
                    acted.add(holder.key.id)
                    await _act(store, conn, holder, secret_hash, report, action, now)
        if not acted:
            return matched


async def report_each(
    store: Store,
    hasher: Hasher,
    found: Sequence[tuple[str, Report]],
    action: str,
    now: datetime,
) -> list[bool | None]:
    """``report_leak`` for each (secret, report) of ``found``, each on its own: one's
    failure (logged, with the error's own text, for the operator) is its None and stops
    none of the others."""
    outcomes: list[bool | None] = []
    for secret, report in found:
        try:
            outcomes.append(await report_leak(store, hasher, secret, report, action, now))
        except ApiError as exc:
            logger.warning("a leak report's token could not be acted on: %s", exc.message)
            outcomes.append(None)
    return outcomes


async def _act(
    store: Store,
    conn: Connection,
    holder: SecretHolder,
    secret_hash: bytes,
    report: Report,
    action: str,
    now: datetime,
) -> None:
    """Disable (or note) the key and record the report: a revocation, which no quota
    refuses (``keysvc.db.quota``)."""
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
    leaked = activities.key_leaked(key, report.actor, now, details)
    await store.record(conn, leaked, revoking=True)
    await store.enqueue(
        conn, key.organization_id, KEY_LEAKED_EVENT, api_key(key), now, revoking=True
    )


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
