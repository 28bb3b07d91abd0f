"""The webhook delivery task: started with the app, it sends the outbox's due deliveries
(``keysvc.db.outbox``), signed (``keysvc.domain.signing``), and schedules the retries;
it also enqueues the ``key.expiring`` warnings, and drops deliveries finished long
enough ago.

An attempt is leased in one short write transaction (so that another worker process
does not make the same attempt at once), made outside any transaction, and its outcome
recorded in another: the API's writes never wait on a receiver. At most
``webhook_concurrency`` attempts run at once, chosen fairly (``outbox.DUE``): one at a
time per webhook, ``webhook_org_concurrency`` per organization, and round the
organizations, so that one tenant's slow receivers do not hold up another's. Each runs
within ``webhook_timeout``, no redirect followed, every address resolved and checked
again (``keysvc.domain.targets``). A 2xx is delivered; anything else is retried after
``webhook_retry_seconds``, doubled with each failure (with jitter, at most an hour),
until a day after the event, then failed. A lease outlives its attempt's timeout, so a
process killed mid-attempt leaves the delivery to be attempted again once its lease
runs out: at least once.

Each recorded attempt moves its webhook's failure clock
(``keysvc.domain.webhooks.attempt_recorded``): a webhook that has failed every attempt
for ``webhook_disable_after_hours`` is disabled, in the same transaction.

Just before it is signed, a delivery's MAC is checked against the row and its webhook
as they are (``keysvc.db.seal.Seal``): one that fails was not written by keysvc (or
was changed since), and is not sent but failed at once, as ``unauthenticated``.
"""

import asyncio
import logging
import random
import time
import uuid
from contextlib import AbstractAsyncContextManager
from datetime import datetime

import aiohttp
from yarl import URL

from keysvc import __version__
from keysvc.config import Settings
from keysvc.credentials import Hasher
from keysvc.db import keys as key_sql
from keysvc.db import outbox
from keysvc.db.contract import Connection, Store
from keysvc.db.outbox import Due
from keysvc.domain.signing import SigningSecret, signed_headers, signing_secret
from keysvc.domain.targets import ip_literal, is_public
from keysvc.domain.webhooks import attempt_recorded
from keysvc.keyview import api_key
from keysvc.logs import log_failure
from keysvc.ops.resolver import BlockedAddress, GuardedResolver
from keysvc.timeutil import Clock, to_text

logger = logging.getLogger("keysvc")

USER_AGENT = f"keysvc-webhooks/{__version__}"
MAX_RETRY_SECONDS = 3600.0
# Beyond the attempt's timeout, before another process may take a leased delivery.
LEASE_MARGIN_SECONDS = 5.0
# How often the task looks for due deliveries when no commit has woken it.
POLL_SECONDS = 1.0
# How often it asks whether anything was committed (a cheap read on the event loop).
WATCH_SECONDS = 0.1
EXPIRING_PER_SCAN = 500


# Why an attempt was not made: the row's MAC does not verify (keysvc.db.seal.Seal).
UNAUTHENTICATED = "unauthenticated"


def retry_delay(base: float, attempts: int) -> float:
    """Seconds before the next attempt, after ``attempts`` failed: ``base`` doubled
    with each, at most an hour, less up to a fifth at random, so that deliveries
    failed together do not come back together."""
    delay: float = min(base * 2.0 ** min(attempts - 1, 32), MAX_RETRY_SECONDS)
    return delay * random.uniform(0.8, 1.0)  # noqa: S311 - jitter, not a secret


def error_class(exc: BaseException) -> str:
    """What the delivery log says of an attempt that got no HTTP status."""
    if isinstance(exc, TimeoutError | asyncio.TimeoutError | aiohttp.ServerTimeoutError):
        return "timeout"
    if isinstance(exc, BlockedAddress) or (
        isinstance(exc, aiohttp.ClientConnectorError) and isinstance(exc.os_error, BlockedAddress)
    ):
        return "blocked_address"
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return "dns_error"
    if isinstance(exc, aiohttp.ClientSSLError):
        return "tls_error"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "connection_refused"
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return "disconnected"
    if isinstance(exc, aiohttp.ClientError):
        return "http_error"
    return "error"


class Deliverer:
    """The app's delivery task and its HTTP client session."""

    def __init__(self, store: Store, hasher: Hasher, settings: Settings, clock: Clock):
        self._store = store
        self._hasher = hasher
        self._settings = settings
        self._clock = clock
        self._owner = str(uuid.uuid4())  # this process's leases
        self._attempts: set[asyncio.Task[None]] = set()
        self._session: aiohttp.ClientSession | None = None
        # Its own, so that its reads neither wait behind nor delay the API's.
        self._reader: Connection | None = None
        self._closing_reader: AbstractAsyncContextManager[Connection] | None = None
        self._task: asyncio.Task[None] | None = None
        self._next_scan = 0.0
        # Set by close: the loop ends at its next turn even if the cancel was lost (a
        # driver's wait_for under Python 3.11 may swallow it and raise its own error).
        self._stopping = False

    async def start(self) -> None:
        self._closing_reader = self._store.delivery_reader()
        self._reader = await self._closing_reader.__aenter__()
        connector = aiohttp.TCPConnector(
            resolver=GuardedResolver(self._settings.webhook_allow_private),
            limit=self._settings.webhook_concurrency,
            use_dns_cache=False,  # each attempt resolves, and is checked, again
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=self._settings.webhook_timeout),
            cookie_jar=aiohttp.DummyCookieJar(),
            headers={"User-Agent": USER_AGENT},
            trust_env=False,
        )
        self._task = asyncio.create_task(self._run(), name="keysvc-webhooks")

    async def close(self) -> None:
        """Stop: attempts under way are cancelled, and their leases given back (they are
        attempted again later), before the store closes."""
        self._stopping = True
        tasks = [t for t in (self._task, *self._attempts) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        try:
            async with self._store.transaction("release_webhook_leases") as conn:
                await outbox.release(conn, self._owner)
        except Exception:
            log_failure(logger, "webhook leases not released; they run out by themselves")
        if self._session is not None:
            await self._session.close()
        if self._closing_reader is not None:
            await self._closing_reader.__aexit__(None, None, None)

    async def _run(self) -> None:
        store = self._store
        seen, polled = -1, 0.0
        while not self._stopping:
            try:
                version = store.data_version()
                if version != seen or time.monotonic() - polled >= POLL_SECONDS:
                    seen, polled = version, time.monotonic()
                    await self._scan_expiring()
                    await self._start_due()
            except asyncio.CancelledError:
                raise
            except Exception:
                if self._stopping:  # the cancel that stops it became this error
                    return
                log_failure(logger, "webhook delivery failed to read or claim; trying again")
                await asyncio.sleep(POLL_SECONDS)
            await asyncio.sleep(WATCH_SECONDS)

    async def _start_due(self) -> None:
        """Lease as many due deliveries as there are free slots, and attempt each."""
        free = self._settings.webhook_concurrency - len(self._attempts)
        now = self._clock().timestamp()
        assert self._reader is not None
        per_org = self._settings.webhook_org_concurrency
        if free <= 0 or not await outbox.any_due(self._reader, now, per_org):
            return
        lease = now + self._settings.webhook_timeout + LEASE_MARGIN_SECONDS
        async with self._store.transaction("claim_webhook_deliveries") as conn:
            claimed = await outbox.claim(conn, now, lease, self._owner, free, per_org)
        for due in claimed:
            task = asyncio.create_task(self._attempt(due))
            self._attempts.add(task)
            task.add_done_callback(self._attempts.discard)

    async def _attempt(self, due: Due) -> None:
        status: int | None = None
        error: str | None = None
        authentic = self._store.seal.verifies(due)
        if not authentic:
            error = UNAUTHENTICATED
            logger.error(
                "webhook delivery %s (event %s, webhook %s) not sent: its row's MAC does not"
                " verify, so keysvc did not write it as it is (written or changed by hand, or"
                " queued before outbox MACs); marked failed",
                due.id, due.event_id, due.webhook_id,
            )  # fmt: skip
        else:
            try:
                status = await self._send(due)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                error = error_class(exc)
        at = self._clock()
        delivered = status is not None and 200 <= status < 300
        state, next_at = "delivered", None
        if not authentic:
            state = "failed"
        elif not delivered:
            next_at = at.timestamp() + retry_delay(
                self._settings.webhook_retry_seconds, due.attempts + 1
            )
            if next_at > due.give_up_at:
                state, next_at = "failed", None
            else:
                state = "pending"
        try:
            async with self._store.transaction("record_webhook_attempt") as conn:
                await outbox.record(conn, due, self._owner, at, status, error, state, next_at)
                if authentic:
                    await attempt_recorded(
                        self._store, conn, due.organization_id, due.webhook_id, delivered, at,
                        self._settings.webhook_disable_after_hours,
                    )  # fmt: skip
        except Exception:
            # The lease runs out, and the delivery is attempted again: at least once.
            log_failure(logger, "webhook attempt not recorded; it will be made again")

    async def _send(self, due: Due) -> int:
        """One POST of the delivery, signed now; its HTTP status."""
        assert self._session is not None
        # A literal address is never resolved, so the resolver never sees it: check it here.
        literal = ip_literal(URL(due.url).raw_host or "")
        private = self._settings.webhook_allow_private
        if literal is not None and not private and not is_public(literal):
            raise BlockedAddress(f"{literal} is not a public address")
        signed = signed_headers(
            self._secrets(due), int(time.time()), due.event_id, due.event_type, due.body
        )
        headers = {"Content-Type": "application/json", **signed}
        async with self._session.post(
            due.url, data=due.body.encode(), headers=headers, allow_redirects=False
        ) as response:
            await response.content.read(64 * 1024)  # the answer itself is not kept
            return response.status

    def _secrets(self, due: Due) -> list[SigningSecret]:
        """The secrets ``due`` is signed with: its webhook's, then, during a rotation's
        overlap (on the app's clock), the one it replaced."""
        ids = (due.webhook_id, due.organization_id, due.url)
        made = [signing_secret(self._hasher, due.nonce, due.secret_version, *ids)]
        previous, version, until = (
            due.previous_nonce, due.previous_secret_version, due.previous_until
        )  # fmt: skip
        overlapping = until is not None and until > self._clock().timestamp()
        if previous is not None and version is not None and overlapping:
            made.append(signing_secret(self._hasher, bytes(previous), version, *ids))
        return made

    async def _scan_expiring(self) -> None:
        """Now and then: enqueue ``key.expiring`` for keys a webhook should warn of and
        has not for this expiry date (remembered in the same transaction, so never twice,
        whichever process scans), and drop the deliveries kept long enough."""
        if time.monotonic() < self._next_scan:
            return
        self._next_scan = time.monotonic() + self._settings.webhook_expiry_scan
        now = self._clock()
        assert self._reader is not None
        found = await outbox.expiring(self._reader, now, EXPIRING_PER_SCAN)
        by_key: dict[tuple[str, str, str], list[str]] = {}
        for item in found:
            by_key.setdefault((item.organization_id, item.key_id, item.expire_at), []).append(
                item.webhook_id
            )
        for (organization_id, key_id, expire_at), webhook_ids in by_key.items():
            await self._warn(organization_id, key_id, expire_at, webhook_ids, now)
        pruned = 0
        if await outbox.any_to_prune(self._reader, now.timestamp()):
            async with self._store.transaction("prune_webhook_deliveries") as conn:
                pruned = await outbox.prune(conn, now.timestamp())
        if len(found) == EXPIRING_PER_SCAN or pruned == outbox.PRUNED_PER_TRANSACTION:
            self._next_scan = 0.0  # more are waiting

    async def _warn(
        self, organization_id: str, key_id: str, expire_at: str, webhook_ids: list[str],
        now: datetime,
    ) -> None:  # fmt: skip
        async with self._store.transaction("enqueue_key_expiring") as conn:
            key = await key_sql.get_key(conn, organization_id, key_id)
            if key is None or key.expire_at is None or to_text(key.expire_at) != expire_at:
                return  # deleted or changed since it was read: the next scan decides
            warn = [w for w in webhook_ids if await outbox.warned(conn, w, key_id, expire_at)]
            if warn:
                data = api_key(key)
                await self._store.enqueue(conn, organization_id, "key.expiring", data, now, warn)
