"""The instances' messages on PostgreSQL: ``Notifications``, the listening connection that
hears commits (keysvc_data) and authorization generations (keysvc_auth), reads the
generation itself rather than believing a payload, acknowledges it signed
(keysvc_seen), and lets a writer wait for every registered instance
(``keysvc.db.postgres.peers``). While it is down, the caches are cold.

Notifications are a fast path, not the only one: the NOTIFY queue is one per cluster,
and any role that may log in anywhere on the server can fill it (LISTEN, hold a
transaction open, NOTIFY from another session). So the probe reads the generation
itself every PROBE_SECONDS, and while the queue is DEAF_USAGE full or more, or an
announcement of this instance's could not be sent, the caches are cold
(``deaf``): nothing is served from them that a lost notification could have made
stale."""

import asyncio
import logging
import os
import secrets
import time
import uuid
from typing import Any

import asyncpg

from keysvc.db.meta import GENERATION
from keysvc.db.postgres import peers
from keysvc.db.postgres.connection import CONNECT_SECONDS
from keysvc.db.postgres.schema import QUIET

logger = logging.getLogger("keysvc")

DATA_CHANNEL = "keysvc_data"
AUTH_CHANNEL = "keysvc_auth"
# Where each instance acknowledges a generation it has heard, signed (keysvc.db.postgres.peers).
SEEN_CHANNEL = "keysvc_seen"
# Each listening connection's application_name: this prefix and its instance. It tells
# an operator which connection is which; the instances go by ``peers.LISTENING``.
LISTENER_PREFIX = peers.LISTENER_PREFIX
# How often the listening connection is checked, and a lost one tried again: the
# longest a dead connection can go unnoticed is about this plus PROBE_TIMEOUT.
PROBE_SECONDS = 1.0
PROBE_TIMEOUT = 2.0
# How long a writer waits for the acknowledgements of a new generation, at most. By
# then every other instance has read a generation at least as new (a probe begun
# before the commit ends within PROBE_TIMEOUT, the next starts PROBE_SECONDS later and
# reads it within PROBE_TIMEOUT), or its probe failed and its caches are cold.
ACKNOWLEDGE_SECONDS = PROBE_SECONDS + 2 * PROBE_TIMEOUT
# How recent the last read of the generation must be (counted from when it began) for
# the caches to serve: a process that was frozen (SIGSTOP, a paused VM), or whose loop
# stalled, neither probed nor failed a probe meanwhile, and must not answer from its
# caches once woken, before its next probe. Below ACKNOWLEDGE_SECONDS, so that a writer
# that waited that long finds every other instance cold or current.
FRESH_SECONDS = PROBE_SECONDS + PROBE_TIMEOUT
# The share of the NOTIFY queue in use from which notifications are not trusted: far
# below full, so that the caches are cold before any announcement can be refused.
DEAF_USAGE = 0.5
# What the probe reads: the generation, and how full the cluster's NOTIFY queue is.
PROBE = f"select ({GENERATION}), pg_notification_queue_usage()"
# The primary's WAL insert position, as a number: past the commit record of every
# transaction visible when it is read, synchronous_commit off included. Read with
# each generation and at each probe when replicas serve reads (keysvc.db.postgres.replicas).
POSITION = "(pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint"


class Notifications:
    """``Freshness`` for PostgreSQL: a version that moves with every commit any
    instance announces, and the authorization generation as last announced."""

    def __init__(
        self, url: str, peer_key: bytes, track_position: bool = False, registered: bool = True
    ):
        self._url = url
        # Whether this is an instance that writers wait for (``peers.REGISTER``): a
        # served one. A command's (``keysvc import``, its planning process, export, the
        # operator's) listens to hear acknowledgements, and is never waited for: paused
        # or busy, it delayed every tenant's authorization change 5 s (rt63 F2). So its
        # caches are always cold: no writer waits for it to hear of a change.
        self.registered = registered
        # Whether the change position is kept (``known_position``): replicas serve reads.
        self._track = track_position
        position = f", {POSITION}" if track_position else ", null"
        self._probe = PROBE + position
        self._generation_read = f"select ({GENERATION}){position}"
        # The newest position read, and the version (``_version``) it covers: every
        # commit this instance had heard of or made when it was read.
        self._position = 0
        self._covered = -1
        self._locating: asyncio.Task[None] | None = None
        self._relocate = False
        # Signs this instance's acknowledgements and checks the others'.
        self._peer_key = peer_key
        self._version = 0
        self.generation: object = None
        self._conn: Any = None
        self._task: asyncio.Task[None] | None = None
        self.listening = asyncio.Event()
        # Listening connections lost so far.
        self.losses = 0
        # The process id tells the operator which process it is; the random part keeps
        # instances on different hosts apart.
        self.instance = f"{os.getpid()}.{secrets.token_hex(4)}"
        self.name = LISTENER_PREFIX + self.instance
        # One statement at a time on the listening connection: probes and acknowledgements.
        self._using = asyncio.Lock()
        # The newest generation heard and not yet acknowledged, and the task sending it.
        self._unacknowledged: str | None = None
        self._acknowledging: asyncio.Task[None] | None = None
        # The newest generation each other instance has acknowledged (an entry for each
        # instance heard since this one started); ``_acknowledged`` is set (and
        # replaced) at each acknowledgement heard.
        self._seen: dict[str, int] = {}
        self._acknowledged = asyncio.Event()
        # Whether an unsigned acknowledgement has been logged yet (once per process).
        self._forgery_logged = False
        # A notification on keysvc_auth is a hint, as any session may send one: the
        # generation is read from the database, one read at a time, and one more if a
        # hint came during it, however many came.
        self._hinted = False
        self._reading: asyncio.Task[None] | None = None
        # The newest generation read: one read later that is not newer (a read begun
        # before this instance's own commit, say) changes nothing.
        self._newest = -1
        # Carried by this instance's own announcements (see is_own_commit).
        self.token = uuid.uuid4().hex
        # Whether notifications are not to be trusted now (see the module).
        self.deaf = False
        # When the last read of the generation that answered began (time.monotonic).
        self._read_at = float("-inf")

    def look(self) -> int:
        stale = time.monotonic() - self._read_at > FRESH_SECONDS
        if self.deaf or stale or not self.listening.is_set() or not self.registered:
            # Cold: nothing read before can be known current, nor anything read now.
            self._version += 1
            self.generation = object()
        return self._version

    def committed(self) -> None:
        """This process committed: what it read before is not current any more."""
        self._version += 1

    # The change position (replicas, keysvc.db.postgres.replicas).

    def known_position(self) -> int | None:
        """The primary's WAL position past every commit this instance has made or
        heard of; None while one is not covered yet by a position read, or while
        notifications are not heard (nothing is known then)."""
        if self.deaf or not self.listening.is_set() or self._covered != self._version:
            return None
        return self._position if self.registered else None

    @property
    def position_column(self) -> str:
        """What a writer's announcement reads besides: the position, when it is kept."""
        return f", {POSITION}" if self._track else ""

    @property
    def version(self) -> int:
        """The version a position read now would cover: read before sending it."""
        return self._version

    def located(self, position: int | None, version: int) -> None:
        """A position read after everything counted in ``version`` was committed."""
        if position is None:
            return
        self._position = max(self._position, int(position))
        self._covered = max(self._covered, version)

    def _locate(self) -> None:
        """Read the position on the listening connection: one read at a time, and one
        more if a commit was heard during it."""
        if not self._track:
            return
        self._relocate = True
        if self._locating is None or self._locating.done():
            self._locating = asyncio.create_task(self._read_position(), name="keysvc-position")

    async def _read_position(self) -> None:
        while self._relocate and (conn := self._conn) is not None:
            self._relocate = False
            try:
                async with asyncio.timeout(PROBE_TIMEOUT), self._using:
                    version = self._version
                    position = await conn.fetchval(f"select {POSITION}")
            except Exception as exc:
                # The probe finds a dead connection; reads stay on the primary meanwhile.
                logger.debug("could not read the WAL position: %s", type(exc).__name__)
                return
            self.located(position, version)

    def _heard(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        if channel == SEEN_CHANNEL:
            self._heard_seen(payload)
        elif channel == AUTH_CHANNEL:
            self._hint()
        elif not self.is_own_commit(channel, payload):
            self._version += 1
            self._locate()

    # The generation, read from the database when a notification hints that it moved.

    def _hint(self) -> None:
        # Until the read answers, nothing cached under the generation before is served:
        # a hint may be a real change (one made by hand is announced only this way),
        # and the very next request must not see what it revoked.
        self.generation = object()
        self._hinted = True
        if self._reading is None or self._reading.done():
            self._reading = asyncio.create_task(self._read_generation(), name="keysvc-generation")

    async def _read_generation(self) -> None:
        """Read the generation until no hint came during the read. A new one is taken
        in (the caches drop what they hold before answering anything more), then
        acknowledged: a writer waiting for it returns only once this instance refuses
        what it revoked. A read that fails leaves the caches cold until the connection
        is listening again, which reads the generation afresh."""
        while self._hinted and (conn := self._conn) is not None:
            self._hinted = False
            try:
                async with asyncio.timeout(PROBE_TIMEOUT), self._using:
                    began = time.monotonic()
                    version = self._version
                    generation, position = await conn.fetchrow(self._generation_read)
            except Exception as exc:
                logger.debug("could not read the generation: %s", type(exc).__name__)
                self._lost(conn)
                await self._drop()
                return
            # Before it is acknowledged: a writer waiting for this instance returns only
            # once it reads no replica that has not replayed the change.
            self.located(position, version)
            self._take(generation, began)

    def _take(self, generation: str, began: float) -> None:
        """A generation read by a statement that began at ``began``: taken in and
        acknowledged when newer than any before."""
        self._read_at = max(self._read_at, began)
        if int(generation) > self._newest:
            self._newest = int(generation)
            self.generation = generation
            self._acknowledge(generation)

    # The NOTIFY queue, which any role that may log in can fill.

    def _queue_used(self, usage: float, generation: str) -> None:
        """The probe's reading of the queue: deaf from DEAF_USAGE, hearing again below
        it (everything read before is stale: commits may have gone unheard)."""
        if usage >= DEAF_USAGE:
            if not self.deaf:
                logger.warning(
                    "the PostgreSQL NOTIFY queue is %.0f%% full; caches off until it empties",
                    usage * 100,
                )
            self.deaf = True
        elif self.deaf:
            self.deaf = False
            self._version += 1
            self.generation = generation
            self._locate()
            logger.warning("the PostgreSQL NOTIFY queue has room again; caches on")

    def unannounced(self, exc: BaseException) -> None:
        """A commit of this instance's could not be announced: deaf until the next probe
        finds the queue with room (the other instances read the generation anyway)."""
        if not self.deaf:
            logger.warning("could not announce a commit (%s); caches off", type(exc).__name__)
        self.deaf = True

    async def start(self) -> None:
        await self._listen()
        self._task = asyncio.create_task(self._watch(), name="keysvc-notifications")

    async def _listen(self) -> None:
        conn = await asyncpg.connect(
            self._url,
            timeout=CONNECT_SECONDS,
            command_timeout=PROBE_TIMEOUT,
            server_settings={"application_name": self.name, **QUIET},
        )
        try:
            await conn.add_listener(DATA_CHANNEL, self._heard)
            await conn.add_listener(AUTH_CHANNEL, self._heard)
            await conn.add_listener(SEEN_CHANNEL, self._heard)
            conn.add_termination_listener(self._lost)
            # Registered once listening, and before the generation is read: a writer
            # that finds this connection registered after its commit waits for this
            # instance, which hears of that commit or reads what it made.
            if self.registered:  # a command's store neither registers nor cleans up
                await conn.execute(peers.REGISTER, self.instance)
                await conn.execute(peers.FORGET_ENDED)
            # Listening before the generation is read: a move in between is heard.
            began = time.monotonic()
            version = self._version
            generation, position = await conn.fetchrow(self._generation_read)
        except BaseException:
            await conn.close()
            raise
        self.generation = generation
        self._newest = int(generation)
        self._read_at = began
        self._conn = conn
        self._version += 1
        self.listening.set()
        # Covers what was heard before the read, not during it: read again.
        self.located(position, version)
        self._locate()
        # A writer may be waiting for a generation this connection never heard of, as it
        # was committed before it listened: what was just read is at least as new.
        self._acknowledge(generation)

    async def _watch(self) -> None:
        """Check the listening connection every PROBE_SECONDS; a lost one makes the
        caches cold until a new one listens."""
        while True:
            await asyncio.sleep(PROBE_SECONDS)
            try:
                if self._conn is None or self._conn.is_closed():
                    raise ConnectionError("the listening connection is closed")
                async with asyncio.timeout(PROBE_TIMEOUT), self._using:
                    began = time.monotonic()
                    version = self._version
                    generation, usage, position = await self._conn.fetchrow(self._probe)
            except Exception:
                if self.listening.is_set():
                    self.losses += 1
                    logger.warning("lost the PostgreSQL notification connection; caches off")
                self.listening.clear()
                await self._drop()
                try:
                    await self._listen()
                except Exception as exc:
                    # Tried again every PROBE_SECONDS; the loss itself was logged.
                    logger.debug("PostgreSQL notifications still down: %s", type(exc).__name__)
                    continue
                logger.warning("PostgreSQL notifications back; caches on")
            else:
                self._queue_used(float(usage), generation)
                self.located(position, version)
                self._take(generation, began)

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.terminate()

    @property
    def backend_pid(self) -> int | None:
        """The listening connection's server process, while there is one."""
        return None if self._conn is None else int(self._conn.get_server_pid())

    async def close(self) -> None:
        tasks = [self._task, self._acknowledging, self._reading, self._locating]
        for task in tasks:
            if task is not None:
                task.cancel()
        await asyncio.gather(*[task for task in tasks if task is not None], return_exceptions=True)
        self.listening.clear()
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                async with asyncio.timeout(PROBE_TIMEOUT):
                    await conn.execute(peers.UNREGISTER, self.instance)
                await conn.close(timeout=PROBE_TIMEOUT)
            except Exception:
                conn.terminate()  # a server that does not answer: closed all the same

    # A listening connection lost between two probes.

    def _lost(self, conn: Any) -> None:
        """The listening connection closed (its server process ended, the network
        reset it): the caches are cold from now on, not from the next probe, as the
        notifications sent meanwhile are lost. ``_watch`` listens again."""
        if conn is not self._conn or not self.listening.is_set():
            return  # closed here (``_drop``, ``close``), or already counted
        self.losses += 1
        logger.warning("lost the PostgreSQL notification connection; caches off")
        self.listening.clear()

    # Acknowledgements: this instance's, and the others' a writer waits for.

    def _acknowledge(self, generation: str) -> None:
        """Tell the other instances, on keysvc_seen, that this one has heard
        ``generation``. Sent from a task of its own, the newest first: generations
        are announced in commit order, so one acknowledgement covers the older ones."""
        self._unacknowledged = generation
        if self._acknowledging is None or self._acknowledging.done():
            self._acknowledging = asyncio.create_task(
                self._send_acknowledgements(), name="keysvc-acknowledgements"
            )

    async def _send_acknowledgements(self) -> None:
        while (generation := self._unacknowledged) is not None:
            self._unacknowledged = None
            conn = self._conn
            if conn is None:
                continue  # listening again acknowledges what it reads
            try:
                async with asyncio.timeout(PROBE_TIMEOUT), self._using:
                    signed = peers.acknowledgement(self._peer_key, self.instance, generation)
                    await conn.execute("select pg_notify($1, $2)", SEEN_CHANNEL, signed)
            except Exception as exc:
                # The probe finds a dead connection, and the writers waiting give up in
                # time; what a new one read meanwhile is still to be sent.
                logger.debug("could not acknowledge a generation: %s", type(exc).__name__)

    def _heard_seen(self, payload: str) -> None:
        acknowledged = peers.acknowledged(self._peer_key, payload)
        if acknowledged is None:
            # Sent by a session without the pepper (or an instance with another one).
            if not self._forgery_logged:
                self._forgery_logged = True
                logger.warning(
                    "dropped an acknowledgement keysvc did not sign on %s: some session"
                    " without the pepper is sending on keysvc's channels",
                    SEEN_CHANNEL,
                )
            return
        instance, seen = acknowledged
        if instance != self.instance and seen > self._seen.get(instance, -1):
            self._seen[instance] = seen
            self._acknowledged.set()
            self._acknowledged = asyncio.Event()

    async def seen_everywhere(self, generation: int, listeners: list[str]) -> None:
        """Return once every instance in ``listeners`` (registered and live,
        ``peers.LISTENING``) has acknowledged ``generation`` or a later one, or after
        ACKNOWLEDGE_SECONDS: by then one that has not has read the generation at its
        probe, or its probe failed and its caches are cold. While the NOTIFY queue is
        full no acknowledgement comes, and a writer waits for the whole bound."""
        if not self.listening.is_set():
            # Cold here, and deaf to the acknowledgements: nothing to wait for.
            logger.debug("not listening: the other instances are not waited for")
            return
        waited_for = set(listeners)
        deadline = asyncio.get_running_loop().time() + ACKNOWLEDGE_SECONDS
        while missing := sorted(i for i in waited_for if self._seen.get(i, -1) < generation):
            acknowledged = self._acknowledged
            try:
                async with asyncio.timeout_at(deadline):
                    await acknowledged.wait()
            except TimeoutError:
                logger.warning(
                    "instances did not acknowledge an authorization change in time;"
                    " their own probes turn their caches off: %s",
                    ", ".join(LISTENER_PREFIX + name for name in missing),
                )
                return

    def is_own_commit(self, channel: str, payload: str) -> bool:
        """Whether a notification is this instance's own commit heard back, which
        moved the version already (``committed``, called by the writer after every
        transaction that may have committed): counted again, it would make everything
        read since that commit look stale, and read again, once more."""
        return channel == DATA_CHANNEL and payload == self.token
