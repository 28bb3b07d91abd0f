"""What both stores share, held by each (composition, not a common base): the reads
and writes that run the same SQL on either backend, given the backend's reader, point
reader, writer and caches; the usage counts, usedAt and revoked-use batches; the
activity chain; and the usage upkeep of a serving store.

``keysvc.db.sqlite.store.Store`` and ``keysvc.db.postgres.store.PgStore`` each make one
``StoreCore`` on their own connections and answer the contract's calls with it.
"""

import asyncio
import hmac
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from keysvc.config import Settings
from keysvc.db import activities as activity_sql
from keysvc.db import credits as credit_sql
from keysvc.db import keys as key_sql
from keysvc.db import meta, outbox, retention
from keysvc.db import roles as role_sql
from keysvc.db import usage as usage_sql
from keysvc.db import webhooks as webhook_sql
from keysvc.db.batching import RevokedUses, Touches
from keysvc.db.cache import Caches
from keysvc.db.contract import Connection, PointReads, Records, RevokedUse, SecretHolder, Writes
from keysvc.db.identities import IdentityStore
from keysvc.db.quota import UNLIMITED, Quota, quota_of
from keysvc.db.roles import RoleStore
from keysvc.db.rows import key_from_joined
from keysvc.db.seal import Seal
from keysvc.db.spendbatch import Pending, SpendBatches
from keysvc.db.timing import Observer, timed
from keysvc.logs import log_failure
from keysvc.models import (
    Activity,
    ActivityKinds,
    ActivityPage,
    Credential,
    Delivery,
    Key,
    KeyPage,
    Spend,
    SpendRule,
    Spent,
    Webhook,
)
from keysvc.timeutil import from_text, utcnow

logger = logging.getLogger("keysvc")
# Compared against when no key answers to a secret, so a miss does a hit's compare.
_ABSENT = bytes(32)


def _holds(offered: bytes, rows: list[Any]) -> bool:
    """Whether a credential read's ``rows`` hold the secret hash ``offered``, compared
    as authentication compares it, found or not."""
    held = rows[0]["credential_secret_hash"] if rows else None
    return hmac.compare_digest(offered, bytes(held) if held else _ABSENT)


def _never(rows: list[Any]) -> bool:
    return False


def _replaced_at(row: Any) -> datetime | None:
    """When a holder's secret, a rotation's previous one, stopped opening its key."""
    return from_text(row["replaced_at"]) if row["replaced_at"] else None


@dataclass(frozen=True)
class UsageUpkeep:
    """How a serving store keeps itself: the usage counts written every
    ``flush_seconds``, rows older than ``retention`` pruned; activity records older
    than ``activity_retention`` pruned (None: kept); each organization's writes
    within ``quota`` (``keysvc.db.quota``)."""

    flush_seconds: float
    retention: timedelta
    activity_retention: timedelta | None = None
    quota: Quota = UNLIMITED


def upkeep_of(settings: Settings) -> UsageUpkeep:
    retention = timedelta(days=settings.usage_retention_days)
    days = settings.activity_retention_days
    return UsageUpkeep(
        settings.usage_flush_seconds,
        retention,
        None if days is None else timedelta(days=days),
        quota_of(settings.org_write_budget_mib, settings.webhook_queue_limit),
    )


class StoreCore:
    def __init__(
        self,
        reader: Connection,
        points: PointReads,
        writer: Writes,
        caches: Caches,
        observer: Observer | None,
        records: Records,
    ):
        self.reader = reader
        self.points = points
        self.writer = writer
        self.caches = caches
        self.observer = observer
        self.records = records
        # Whether writes find the disk full (keysvc.db.sqlite.diskspace), for every write path.
        self.space = writer.space
        # The activity log's chain key: set once the pepper is loaded (key_activities).
        self.chain = activity_sql.Chain()
        # The outbox rows' MAC key: set once the pepper is loaded (key_outbox).
        self.seal = Seal()
        self.touches = Touches(writer)
        self.revoked_uses = RevokedUses(writer, self.chain, self.seal)
        self.roles = RoleStore(reader, observer)
        self.identities = IdentityStore(reader, observer, caches)
        # Verify's spends of credits, in group commits (issue 29), in the transactions
        # ``spend_writes`` gives (SQLite's store sets its own: ``keysvc.db.sqlite.store``).
        self.spend_writes: Callable[[], AbstractAsyncContextManager[Connection]] = (
            writer.transaction
        )
        self.spends = SpendBatches(self._spend_transaction, self._spend_all)
        self._upkeep: asyncio.Task[None] | None = None
        self._first_round = asyncio.Event()

    def start_upkeep(self, upkeep: UsageUpkeep) -> None:
        """Write and prune the usage counts in the background, as a serving store does;
        without it they are written with usedAt and at close. Only once the pepper has
        keyed the chain and the outbox: the first prune runs at once, and an unkeyed
        chain would fail it until the next round, an hour later."""
        if not (self.chain.is_keyed and self.seal.is_keyed):
            raise RuntimeError("the upkeep starts once the pepper has keyed the store")
        self.chain.quota = upkeep.quota
        self._upkeep = asyncio.create_task(self._keep_usage(upkeep))

    async def first_upkeep(self) -> None:
        """Once the upkeep's first round of pruning has run (at once when no upkeep
        runs)."""
        if self._upkeep is None:
            return
        round_done = asyncio.ensure_future(self._first_round.wait())
        try:  # an upkeep that ended (it never should) ends the wait too
            await asyncio.wait({round_done, self._upkeep}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            round_done.cancel()

    @property
    def quota(self) -> Quota:
        """What each organization may write (``keysvc.db.quota``)."""
        return self.chain.quota

    async def _keep_usage(self, upkeep: UsageUpkeep) -> None:
        """Write the usage counts every flush interval; prune old rows now, then at
        most every PRUNE_EVERY_SECONDS, and with them drop the previous credentials
        of rotations whose grace has ended and the tombstones of keys deleted before the
        retention. A failure is logged and tried again later."""
        pruned_at: float | None = None
        while True:
            if pruned_at is None or time.monotonic() - pruned_at >= usage_sql.PRUNE_EVERY_SECONDS:
                pruned_at = time.monotonic()
                now = utcnow()
                await self._tidy(
                    "prune_usage", "pruning old usage counts",
                    usage_sql.prune, now - upkeep.retention,
                )  # fmt: skip
                await self._tidy(
                    "drop_ended_credentials", "dropping the credentials of ended graces",
                    key_sql.drop_ended_previous, now,
                )  # fmt: skip
                await self._tidy(
                    "prune_tombstones", "pruning the tombstones of deleted keys",
                    key_sql.prune_tombstones, now - upkeep.retention,
                )  # fmt: skip
                if upkeep.activity_retention is not None:
                    await self.prune_activities(now - upkeep.activity_retention)
                self._first_round.set()
            await asyncio.sleep(upkeep.flush_seconds)
            await self.touches.write_counts()

    async def prune_activities(self, before: datetime) -> None:
        """Prune the activity records from before ``before``, a short transaction at a
        time (``keysvc.db.retention``); a failure is logged, and the next round tries
        again."""
        try:
            while True:
                async with self.transaction("prune_activities") as conn:
                    if not await retention.prune(conn, self.chain, before):
                        return
        except Exception:
            log_failure(logger, "pruning old activity records failed; trying again later")

    async def _tidy(
        self,
        operation: str,
        doing: str,
        work: Callable[[Connection, datetime], Awaitable[None]],
        moment: datetime,
    ) -> None:
        """One upkeep write in its own transaction; a failure is logged, and the next
        round tries again."""
        try:
            async with self.transaction(operation) as conn:
                await work(conn, moment)
        except Exception:
            log_failure(logger, "%s failed; trying again later", doing)

    async def finish_writes(self, *flushers: asyncio.Task[None] | None) -> None:
        """Stop the upkeep, write the counts not yet written (so that a clean stop loses
        none), and wait for every write under way, ``flushers`` too."""
        if self._upkeep is not None:
            self._upkeep.cancel()
            await asyncio.gather(self._upkeep, return_exceptions=True)
        await self.spends.finish()
        await self.touches.write_counts()
        running = (*flushers, self.touches.flusher, self.revoked_uses.flusher)
        await asyncio.gather(*(t for t in running if t is not None), return_exceptions=True)

    @asynccontextmanager
    async def transaction(
        self,
        operation: str,
        timed: bool = True,
        writes: Callable[[], AbstractAsyncContextManager[Connection]] | None = None,
    ) -> AsyncIterator[Connection]:
        """One write transaction, for the domain to read, check its rules and write in
        (the writer's, or the one ``writes`` gives). Its duration, waiting for the write
        lock included, is reported to the observer as ``operation``'s, as ``timed``
        reports a call's: the name is required, so that no write goes unmeasured, but
        for one whose duration would tell a public caller what it found
        (``timed=False``: a leak report's)."""
        observer = self.observer if timed else None
        started = time.perf_counter()
        try:
            async with (writes or self.writer.transaction)() as conn:
                yield conn
        finally:
            if observer is not None:
                observer(operation, time.perf_counter() - started)

    # The database as a whole

    @timed
    async def recorded_pepper(self) -> str | None:
        """The fingerprint of the pepper this database was made with; None when new."""
        return await meta.recorded_pepper(self.reader)

    @timed
    async def check_pepper(self, fingerprint: str) -> None:
        """Record the pepper's fingerprint on first start; refuse a different pepper later."""
        async with self.writer.transaction() as conn:
            await meta.check_pepper(conn, fingerprint)

    @timed
    async def has_organization(self) -> bool:
        return await meta.has_organization(self.reader)

    @timed
    async def organization_ids(self) -> list[str]:
        """Every organization's ID, oldest first."""
        return await meta.organization_ids(self.reader)

    async def record(self, conn: Connection, activity: Activity, revoking: bool = False) -> None:
        """Inside a write transaction: log ``activity`` (``keysvc.db.activities.record``)."""
        await activity_sql.record(conn, self.chain, activity, revoking=revoking)

    async def enqueue(
        self, conn: Connection, organization_id: str, event_type: str, data: dict[str, Any],
        now: datetime, webhook_ids: Collection[str] | None = None, revoking: bool = False,
    ) -> None:  # fmt: skip
        """Inside a write transaction: send an event (``keysvc.db.outbox.enqueue``)."""
        await outbox.enqueue(
            conn, self.seal, self.quota, organization_id, event_type, data, now, webhook_ids,
            revoking,
        )  # fmt: skip

    def key_outbox(self, key: bytes) -> None:
        """Key the outbox rows' MACs (from the pepper)."""
        self.seal.keyed(key)

    async def key_activities(self, key: bytes) -> None:
        """Key the activity chains (from the pepper), and start the chain of each
        organization without a head: with a create record of each key and custom role
        it holds (those of a database from before the log, ``Records.pre_log``), or an
        empty head."""
        self.chain.keyed(key)
        async with self.writer.transaction() as conn:
            for organization_id in await activity_sql.unheaded(conn):
                existing = await self._existing(conn, organization_id, utcnow())
                await activity_sql.seal(conn, self.chain, organization_id, existing)

    async def _existing(
        self, conn: Connection, organization_id: str, now: datetime
    ) -> list[Activity]:
        """The create records of what an organization from before the log holds: its
        custom roles (with their holders), then its keys, oldest first."""
        roles = await role_sql.custom_roles(conn, organization_id)
        keys: list[Key] = []
        after, more = 0, True
        while more:
            page, more, _, _ = await key_sql.list_page(conn, organization_id, after, 500)
            keys += page
            after = page[-1].org_seq if page else after
        if not roles and not keys:
            return []
        return self.records.pre_log_of()(roles, keys, now)

    # Credits (issue 29)

    async def spend_credits(
        self, organization_id: str, key_id: str, now: datetime, rule: SpendRule
    ) -> Spend | None:
        """The key's credits read, ``rule``'s answer written over them (a compare-and-set,
        ``keysvc.db.credits``) and its events enqueued, in a write transaction shared with
        the spends that arrive meanwhile (``keysvc.db.spendbatch``); None when the key's
        credits are unlimited. Answered once committed."""
        return (await self.spends.spend(Pending(organization_id, key_id, now, rule))).key

    async def spend_shared(
        self,
        organization_id: str,
        key_id: str,
        external_id: str,
        now: datetime,
        rule: SpendRule,
        identity_rule: SpendRule,
    ) -> Spent:
        """As ``spend_credits``, from the key's credits and its identity's (issue 36)
        together: both enough, or neither spent."""
        return await self.spends.spend(
            Pending(organization_id, key_id, now, rule, external_id, identity_rule)
        )

    def _spend_transaction(self, operation: str) -> AbstractAsyncContextManager[Connection]:
        return self.transaction(operation, writes=self.spend_writes)

    async def _spend_all(self, conn: Connection, batch: Sequence[Pending]) -> list[Spent]:
        """A batch's spends (``keysvc.db.credits.spend_batch``) and their events enqueued,
        inside the write transaction ``conn`` is in."""
        answers, events = await credit_sql.spend_batch(conn, batch)
        for organization_id, event_type, data, now in events:
            await self.enqueue(conn, organization_id, event_type, data, now)
        return answers

    # Keys

    @timed
    async def get_key(self, organization_id: str, key_id: str) -> Key | None:
        """The key as committed now: from the cache only if nothing was committed since."""
        caches = self.caches
        cached = caches.cached_key(organization_id, key_id)
        if cached is not None:
            return cached
        version = caches.data_version()  # read before the row, so a later commit is not hidden
        generation = caches.generation
        rows = await self.points.rows(key_sql.KEY_BY_ID_JOINED, (key_id, organization_id))
        key = key_from_joined(rows)
        if key is not None:
            caches.refresh_key(key, version, generation)
        return key

    @timed
    async def list_keys(
        self, organization_id: str, after: int, limit: int, external_id: str | None = None
    ) -> KeyPage:
        """Keys oldest first, after the organization's ``after``-th key (``Key.org_seq``):
        a keyset page, as cheap at page N as page 1; only ``external_id``'s when given."""
        keys, more, total, identity_ids = await key_sql.list_page(
            self.reader, organization_id, after, limit, external_id
        )
        return KeyPage(keys=keys, more=more, total=total, identity_ids=identity_ids)

    async def find_credential(
        self, key_id_hash: bytes, offered: bytes | None = None
    ) -> Credential | None:
        """The credential for a keyed key-ID hash, current or previous (``Credential.until``):
        cached, unless authorization moved since.

        ``offered``, the secret hash a check compares: rows read on a replica that do not
        hold it (none found, or another secret) are read again on the primary, so a
        failed check costs the same reads whether the key ID is unknown or the secret
        wrong, and a key created or rotated through another instance is found
        (docs/SECURITY.md, "Read replicas")."""
        caches = self.caches
        version = caches.data_version()
        generation = caches.generation
        entry = caches.credentials.get(key_id_hash)
        if entry is not None:
            return entry.credential
        accept = bool if offered is None else partial(_holds, offered)
        rows = await self.points.rows(
            key_sql.CREDENTIAL_JOINED, key_sql.credential_params(key_id_hash), accept
        )
        key = key_from_joined(rows)
        if key is None:
            return None
        credential = key_sql.credential_of(key, rows[0])
        if not (credential.deleted or credential.rotated):  # nor is a tombstone cached
            caches.keep_credential(key_id_hash, credential, version, generation)
        return credential

    async def read_as_uncached(self, key_id_hash: bytes) -> None:
        """The read ``find_credential`` makes for an uncached key (its row joined with its
        roles', one statement), with its answer unused: a wrong secret for a cached key
        then costs the caller the same read as an unknown key ID or a wrong secret for
        an uncached key, so that the time of a 401 does not tell them apart
        (docs/SECURITY.md): on a replica, then the primary, as a failed check's."""
        params = key_sql.credential_params(key_id_hash)
        await self.points.rows(key_sql.CREDENTIAL_JOINED, params, _never)

    async def keys_with_secret(
        self, conn: Connection, secret_hash: bytes, now: datetime
    ) -> list[SecretHolder]:
        """The keys that answer to the secret of ``secret_hash`` at ``now``: as their
        current secret, or a rotation's previous one, within its grace or past it (its
        tombstone). The same work for a hit as for a miss, as authentication's check
        does: one read (``keysvc.db.keys.BY_SECRET``) and one of the matches' roles,
        empty or not, and each row's hash, or an absent one when there is none, compared
        with ``hmac.compare_digest``."""
        rows = await key_sql.rows_with_secret(conn, secret_hash, now)
        matched = [
            row for row in rows if hmac.compare_digest(secret_hash, bytes(row["matched_hash"]))
        ]
        if not rows:
            hmac.compare_digest(secret_hash, _ABSENT)
        keys = await key_sql.keys_from_rows(conn, matched, even_none=True)
        return [
            SecretHolder(key, bool(row["previous"]), bool(row["reported"]), _replaced_at(row))
            for key, row in zip(keys, matched, strict=True)
        ]

    def note_revoked_use(
        self, key_id: str, moment: datetime, make: Callable[[], RevokedUse]
    ) -> None:
        """Record the use of a revoked key ``make`` returns (its activity and its
        ``key.used_after_revoke`` event), unless one was this minute (``RevokedUses``);
        written later, never on the request's path."""
        self.revoked_uses.note(key_id, moment, make)

    # The activity log

    @timed
    async def get_activity(self, organization_id: str, activity_id: str) -> Activity | None:
        return await activity_sql.get(self.reader, organization_id, activity_id)

    @timed
    async def list_activities(
        self,
        organization_id: str,
        after: int,
        limit: int,
        since: datetime | None = None,
        until: datetime | None = None,
        kinds: ActivityKinds | None = None,
        max_bytes: int | None = None,
    ) -> ActivityPage:
        """Oldest first, after the organization's ``after``-th record (a keyset page), of
        ``kinds`` only (None: every record), ``max_bytes`` of them at most."""
        return await activity_sql.page(
            self.reader, organization_id, after, limit, since, until, kinds, max_bytes
        )

    # Webhooks (their writes run in the domain's transactions)

    async def list_webhooks(self, organization_id: str) -> list[Webhook]:
        return await webhook_sql.list_webhooks(self.reader, organization_id)

    async def get_webhook(self, organization_id: str, webhook_id: str) -> Webhook | None:
        return await webhook_sql.get_webhook(self.reader, organization_id, webhook_id)

    async def delivery_page(
        self, webhook_id: str, before: int | None, limit: int
    ) -> tuple[list[Delivery], bool, int]:
        """A page of the webhook's deliveries (``keysvc.db.webhooks.delivery_page``)."""
        return await webhook_sql.delivery_page(self.reader, webhook_id, before, limit)

    # Usage

    @timed
    async def touch_used(self, key_id: str, minute: datetime) -> None:
        """Set usedAt to ``minute`` unless it is already there (``Touches.touch``)."""
        await self.touches.touch(key_id, minute)

    @timed
    async def usage_series(
        self, key_id: str, start: datetime, end: datetime, width: int
    ) -> Mapping[str, Sequence[int]]:
        """The key's usage counts from ``start`` up to ``end`` as written, summed by
        bucket, in ``keysvc.db.usage.COUNTED``'s order (``keysvc.db.usage.series_counted``)."""
        return await usage_sql.series_counted(self.reader, key_id, start, end, width)
