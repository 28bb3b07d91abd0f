"""Leaked secrets: what a report that a key's secret leaked does, whoever makes it
(revoke-by-secret over the API, ``keysvc revoke-leaked``, GitHub's secret scanning).

Holding the secret is the authority: the key is found by the secret alone
(``Store.keys_with_secret``: its current secret, or a rotation's previous one, within
its grace or past it). Under the ``disable`` action (the default,
``KEYSVC_LEAKED_KEY_ACTION``) an enabled key is disabled the way a PATCH disables it:
its state-changed activity and ``key.updated`` event, the authorization generation
moved so that every credential cache drops it, on both backends, before the answer.
Under ``notify`` the key is left as it is. A secret a rotation replaced, past its grace
(its tombstone, kept for the retention), is a hit that never disables, whatever the
action: the key's owner may have rotated to rescue it, or a thief holding
``keys:update`` rotated it with the leaked credentials; either way the owner is told.
Always, in the same transaction, a ``key_leaked`` activity records who reported it,
where it was found, which secret it was (``leakedSecret`` in the event) and what was
done, and the ``key.leaked`` event is sent. A report of a secret already reported for that key
changes and records nothing: GitHub reports a token again for each place it finds it.
A report is a revocation: never refused for the key's organization's write budget or
a webhook's full queue (``keysvc.db.quota``), so that nothing the leaked key wrote can
delay its end; and each token of a report is acted on alone (``report_each``).

A revoke-by-secret report is not acted on while its reporter waits: ``receive`` writes
it (its keyed hash, never the secret) before the answer, the same statements for a hit
and a miss, and ``PendingReports`` acts on it within about a second, in the background,
so that neither the answer nor its time tells a hit from a miss, and a crash loses
nothing acknowledged. The CLI's and GitHub's reports are acted on before their answer.
"""

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from keysvc.credentials import Hasher
from keysvc.db import keys as key_sql
from keysvc.db import pendingleaks as pending_sql
from keysvc.db.contract import Connection, SecretHolder, Store
from keysvc.domain import activities
from keysvc.domain.keys import announce_change
from keysvc.errors import ApiError, DatabaseUnavailable, ServiceUnavailable
from keysvc.keyview import api_key
from keysvc.models import Actor, KeyChange
from keysvc.timeutil import Clock, to_text

logger = logging.getLogger("keysvc")

DISABLE = "disable"  # else "notify": KEYSVC_LEAKED_KEY_ACTION (keysvc.settingvalues)
# What a report of a secret a rotation replaced does to an enabled key, whatever the action.
LEFT_ENABLED = "left enabled"
KEY_LEAKED_EVENT = "key.leaked"
# Who reported a leak, as its activity says.
REVOKE_LEAKED, CLI, GITHUB = "revoke-leaked", "cli", "github"
# The actor of a report from the command line.
CLI_ACTOR = Actor("system", details="keysvc revoke-leaked")


# Revoke-by-secret reports that may wait for their work; past it, 503 for every report
# alike, hit or miss, before anything is written.
MAX_PENDING = 10_000
BUSY = "too many leak reports are waiting to be acted on; send the report again shortly"
BUSY_RETRY_AFTER = 5
# How often each instance looks for reports it was not woken for: another process's,
# or those a killed one left.
POLL_SECONDS = 1.0


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
    """Act on the report that ``secret`` leaked, at once (the CLI's and GitHub's
    reports); whether it is the secret of some key (current, or previous within its
    grace), reported before or not. Each key is acted on once, however many of its
    credentials answer to the secret; keys not reported yet are read first,
    ``LEAKED_KEYS_READ`` a transaction, until none is left, so that every key a hashData
    client gave this secret is reached. The secret is trimmed of surrounding whitespace
    first."""
    secret_hash = _hash_of(hasher, secret)
    matched = False
    while True:
        # Untimed: its duration in /metrics would tell a hit from a miss.
        async with store.transaction("report_leak", timed=False) as conn:
            holders, acted = await _act_on_holders(
                store, conn, secret_hash, report, action, now, now
            )
            matched = matched or bool(holders)
        if not acted:
            return matched


def _hash_of(hasher: Hasher, secret: str) -> bytes:
    """The keyed hash keys are found by (``keysvc.db.keys.BY_SECRET``)."""
    # Surrounding blanks are never part of a secret keysvc makes; a pasted line end would
    # otherwise revoke nothing. Trimmed here, the API, the CLI and GitHub's reports agree.
    return hasher.of_plain(secret.strip())


async def _act_on_holders(
    store: Store,
    conn: Connection,
    secret_hash: bytes,
    report: Report,
    action: str,
    found_at: datetime,
    now: datetime,
) -> tuple[list[SecretHolder], int]:
    """Inside a write transaction: the keys that answered to the secret at ``found_at``
    (one read of at most ``LEAKED_KEYS_READ``), and how many not reported yet were acted
    on now."""
    holders = await store.keys_with_secret(conn, secret_hash, found_at)
    acted: set[str] = set()
    for holder in holders:
        if not holder.reported and holder.key.id not in acted:
            acted.add(holder.key.id)
            await _act(store, conn, holder, secret_hash, report, action, now)
    return holders, len(acted)


async def receive(
    store: Store, hasher: Hasher, secret: str, actor: Actor, action: str, now: datetime
) -> None:
    """A revoke-by-secret report, written to be acted on (``PendingReports``) before
    its reporter is answered: the secret's keyed hash, ``actor``, ``action`` and
    ``now``, in one transaction whose statements are the same whether the secret is a
    key's or not. ServiceUnavailable, for every report alike, when ``MAX_PENDING``
    wait already."""
    secret_hash = _hash_of(hasher, secret)
    # Untimed too: the wait for the write lock, behind a hit's work, would show there.
    async with store.transaction("receive_leak_report", timed=False) as conn:
        if await pending_sql.count_pending(conn, MAX_PENDING) >= MAX_PENDING:
            raise ServiceUnavailable(BUSY, headers={"Retry-After": str(BUSY_RETRY_AFTER)})
        await pending_sql.add_pending(conn, secret_hash, actor, action, now)


class PendingReports:
    """An instance's background task for the reports ``receive`` wrote: the oldest
    first, each acted on (``_act``) and deleted in the same write transaction, so that a
    crash at any point leaves it for the next round, and the write lock (the instances'
    own on PostgreSQL) keeps two processes off one report. Woken by ``wake`` after a
    report this process wrote; else it looks every ``poll`` seconds, which also finds
    what a killed process left. A round's failure is logged, and tried again at the
    next."""

    def __init__(self, store: Store, clock: Clock, poll: float = POLL_SECONDS) -> None:
        self._store = store
        self._clock = clock
        self.poll = poll
        self._woken = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # The report the running step took, passed over if its work fails.
        self._taken: int | None = None
        # Rounds failed in a row: only the first of them is logged.
        self._failed_rounds = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="keysvc-leak-reports")

    def wake(self) -> None:
        self._woken.set()

    async def close(self) -> None:
        """Stop: a report being acted on is rolled back and waits for the next start."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def work_through(self) -> int:
        """Act on every report waiting now, oldest first; how many transactions it took.
        A report whose work fails (logged) is passed over until the next round, so that
        it holds up none after it; the database's own trouble stops the round."""
        steps, after = 0, 0
        while True:
            self._taken = None
            try:
                done = await self._step(after)
            except DatabaseUnavailable:
                raise
            except Exception as exc:
                if self._taken is None:
                    raise
                logger.warning("a pending leak report could not be acted on now: %r", exc)
                after = self._taken
                continue
            if not done:
                return steps
            steps += 1

    async def _run(self) -> None:
        while True:
            try:
                # Looked for on a reader: a write transaction every second would hold the
                # write lock (every instance's, on PostgreSQL) and announce a change.
                async with self._store.delivery_reader() as reader:
                    await self._rounds(reader)
            except Exception:  # the database's trouble: the reports wait for the next round
                # Its first round says why; the rest of the trouble, one round a poll,
                # adds nothing to the log until it ends.
                if not self._failed_rounds:
                    logger.exception("pending leak reports could not be acted on now")
                self._failed_rounds += 1
                await asyncio.sleep(self.poll)

    async def _rounds(self, reader: Connection) -> None:
        while True:
            self._woken.clear()
            pending = await pending_sql.any_pending(reader)
            if self._failed_rounds:
                logger.info(
                    "pending leak reports are acted on again, after %d failed rounds",
                    self._failed_rounds,
                )
                self._failed_rounds = 0
            if pending:
                await self.work_through()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll):
                    await self._woken.wait()

    async def _step(self, after: int) -> bool:
        """One transaction on the oldest report past ``after``: its keys not acted on
        yet, the report deleted once every key that answers to it was read. False when
        none waits."""
        async with self._store.transaction("report_leak", timed=False) as conn:
            pending = await pending_sql.oldest_pending(conn, after)
            if pending is None:
                return False
            self._taken = pending.seq
            report = Report(REVOKE_LEAKED, pending.actor)
            holders, acted = await _act_on_holders(
                self._store, conn, pending.secret_hash, report, pending.action,
                pending.reported_at, self._clock(),
            )  # fmt: skip
            if not acted or len(holders) < key_sql.LEAKED_KEYS_READ:
                await pending_sql.remove_pending(conn, pending.seq)
        return True


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
    if holder.replaced_at is not None:
        # A secret a rotation replaced: the key's owner may have rotated it to rescue the
        # key, so its new secret is not taken from them; they are told instead.
        done = LEFT_ENABLED if key.state == "enabled" else "already disabled"
    elif action == DISABLE and key.state == "enabled":
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
    event = {**api_key(key), "leakedSecret": _secret_of(holder)}
    await store.enqueue(conn, key.organization_id, KEY_LEAKED_EVENT, event, now, revoking=True)


def _secret_of(holder: SecretHolder) -> dict[str, Any]:
    """Which of the key's secrets was reported: ``credential`` (current or previous)
    and, for a previous secret that no longer opens the key, ``replacedAt`` (when it
    stopped: the rotation, or its grace's end) and ``keyLeftEnabled``."""
    secret: dict[str, Any] = {"credential": "previous" if holder.previous else "current"}
    if holder.replaced_at is not None:
        secret["replacedAt"] = to_text(holder.replaced_at)
        secret["keyLeftEnabled"] = holder.key.state == "enabled"
    return secret


def _details(report: Report, done: str, holder: SecretHolder) -> dict[str, Any]:
    """What the ``key_leaked`` activity keeps of the report."""
    details: dict[str, Any] = {"reporter": report.reporter, "action": done}
    details.update(_secret_of(holder))
    given = (("url", report.url), ("source", report.source), ("tokenType", report.token_type))
    for name, value in given:
        if value is not None:
            details[name] = value
    return details
