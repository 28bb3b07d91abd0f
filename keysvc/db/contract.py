"""The store contract: what the domain, the HTTP layer and the operators' tools may ask
of a database, whichever backend serves it.

``Store`` is the front (``keysvc.db.sqlite.store.Store`` on SQLite,
``keysvc.db.postgres.store.PgStore`` on PostgreSQL); ``Connection`` is what the
SQL functions (``keysvc.db.keys``, ``roles``, ``outbox``...) run their statements on,
inside ``Store.transaction`` or on the store's own reader. A backend's failures reach callers
as keysvc's own errors (``keysvc.errors``): ``DatabaseUnavailable``, ``Conflict``,
``InsufficientStorage``, never a driver's exception.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from keysvc.db.seal import Seal
from keysvc.models import (
    Activity,
    ActivityKinds,
    ActivityPage,
    Credential,
    Delivery,
    Identity,
    IdentityPage,
    Key,
    KeyPage,
    NewKey,
    Role,
    RoleDetail,
    RolePage,
    Spend,
    SpendRule,
    Spent,
    Webhook,
)

if TYPE_CHECKING:
    from keysvc.db.timing import Observer


# The create records of what an organization from before the activity log holds: its
# custom roles, then its keys (``keysvc.domain.activities.pre_log``).
PreLog = Callable[[Sequence[RoleDetail], Sequence[Key], datetime], list[Activity]]
# The body of a created key's ``key.created`` event (``keysvc.http.render.api_key``).
KeyEvent = Callable[[Key], dict[str, Any]]
# The domain's rule for a create, run again inside its write transaction with the
# roles it grants as they are then (by ID; one deleted since is missing, and the
# insert refuses it): why the create is refused now, or None. Another write may have
# widened a role since the domain checked it before the write.
Recheck = Callable[[NewKey, Mapping[str, Role]], Exception | None]
# The activity a create records, made from its key once inserted.
Announce = Callable[[Key], Activity]
# A rendered page of a list: its items' JSON and the rest of its envelope.
Rendered = tuple[bytes, bytes]


@dataclass(frozen=True)
class RevokedUse:
    """A revoked key's use: its activity, and the key's public view for the event."""

    activity: Activity
    key_view: dict[str, Any]


@dataclass(frozen=True)
class SecretHolder:
    """A key that answers to a secret (``Store.keys_with_secret``): as its current secret,
    or as a rotation's previous one (``previous``); ``reported``: this secret was
    reported leaked for it before; ``replaced_at``: when a rotation's previous secret
    stopped opening the key, None while it still does."""

    key: Key
    previous: bool
    reported: bool
    replaced_at: datetime | None = None


@dataclass(frozen=True)
class Records:
    """What a store writes but the layers above it shape: given when it is opened, as
    the database layer imports neither the domain nor the HTTP layer. A store opened
    without one refuses the writes that need it."""

    pre_log: PreLog | None = None
    key_event: KeyEvent | None = None

    def pre_log_of(self) -> PreLog:
        if self.pre_log is None:
            raise RuntimeError("this store was opened without the pre-log records")
        return self.pre_log

    def key_event_of(self) -> KeyEvent:
        if self.key_event is None:
            raise RuntimeError("this store was opened without the key.created event body")
        return self.key_event


# A store opened on its own (tests, tools): refuses the writes that need records.
NO_RECORDS = Records()


class Changed(Protocol):
    """What a statement tells of its work: the rows it changed."""

    @property
    def rowcount(self) -> int: ...


class Connection(Protocol):
    """A connection as the SQL functions use it: statements in SQLite's dialect with
    ``?`` parameters; rows read by column name or position."""

    def execute(self, sql: str, parameters: Iterable[Any] = ..., /) -> Awaitable[Changed]: ...

    def executemany(
        self, sql: str, parameters: Iterable[Iterable[Any]], /
    ) -> Awaitable[object]: ...

    def execute_fetchall(
        self, sql: str, parameters: Iterable[Any] = ..., /
    ) -> Awaitable[Iterable[Any]]: ...

    @property
    def in_transaction(self) -> bool: ...


class Space(Protocol):
    """Whether the database's disk has room for writes (``keysvc.db.sqlite.diskspace``)."""

    def ready(self) -> bool: ...


class Writes(Protocol):
    """A backend's write transactions (SQLite's ``Writer``, PostgreSQL's ``PgWriter``)."""

    @property
    def space(self) -> Space: ...

    def transaction(self) -> AbstractAsyncContextManager[Connection]: ...

    async def authorization_changed(self, conn: Connection) -> None: ...


# Whether a point read's rows will do (``PointReads.rows``); ``bool``: any row.
Accept = Callable[[list[Any]], bool]


class PointReads(Protocol):
    """Indexed reads of a few rows (SQLite's ``PointReader``, PostgreSQL's pool).

    ``accept`` says whether rows read where a commit may not have reached yet (a
    replica) will do; rows it refuses are read again where every commit is (the
    primary). A reader with one place to read ignores it."""

    async def rows(
        self, sql: str, params: Sequence[object], accept: Accept = bool
    ) -> list[Any]: ...


class KeyCounts(Protocol):
    """The key-state counts behind the ``keysvc_keys`` gauge (``keysvc.db.keystates``)."""

    def counts(self, now: datetime) -> Awaitable[dict[str, int]]: ...

    def close(self) -> Awaitable[None]: ...


class SharedCountStore(Protocol):
    """The counts several instances share (``keysvc.domain.sharedlimits``)."""

    async def add_shared_counts(
        self, rows: list[tuple[str, int, float, int]]
    ) -> dict[tuple[str, int], int]: ...

    async def prune_shared_counts(self, now: float) -> None: ...

    async def blocked_networks(self, start: int, limit: int, most: int) -> dict[str, int]: ...


class RoleReads(Protocol):
    """The roles as read outside a transaction (``keysvc.db.roles.RoleStore``)."""

    def resolve_roles(
        self, organization_id: str, names: Sequence[str], ids: Sequence[str]
    ) -> Awaitable[list[Role]]: ...

    def list_roles(
        self, organization_id: str, after: tuple[int, str], limit: int
    ) -> Awaitable[RolePage]: ...

    def get_role(self, organization_id: str, role_id: str) -> Awaitable[RoleDetail | None]: ...


class IdentityReads(Protocol):
    """The identities as read outside a transaction (``keysvc.db.identities.IdentityStore``)."""

    def get_identity(
        self, organization_id: str, identity_id: str
    ) -> Awaitable[Identity | None]: ...

    def list_identities(
        self, organization_id: str, after: int, limit: int, external_id: str | None = None
    ) -> Awaitable[IdentityPage]: ...

    def identity_of(self, organization_id: str, external_id: str) -> Awaitable[Identity | None]: ...

    def keys_of(self, identity: Identity) -> Awaitable[list[str]]: ...

    def held_by_keys(self, organization_id: str, external_id: str) -> Awaitable[frozenset[str]]:
        """Every permission any of the organization's keys with ``external_id`` holds."""
        ...

    def sharing(self, organization_id: str, external_id: str) -> Awaitable[str | None]:
        """The identity whose credits the key's verifies spend from (cached)."""
        ...

    def limits(
        self, organization_id: str, external_id: str
    ) -> Awaitable[tuple[str | None, str | None]]:
        """The identity's UUID and named rate limits, stored form (cached)."""
        ...

    def sharing_here(self, organization_id: str, external_id: str) -> tuple[bool, str | None]:
        """``sharing`` from the cache, without an await: (False, None) when not cached."""
        ...

    def limits_here(
        self, organization_id: str, external_id: str
    ) -> tuple[bool, tuple[str | None, str | None]]:
        """``limits`` from the cache, without an await: (False, ...) when not cached."""
        ...


class Store(Protocol):
    """A database opened to serve (``keysvc.db.backends.open_store``). Its caches
    (``keysvc.db.cache.Caches``) stay inside it: the ``cached_*`` calls answer from
    them synchronously, without a statement, or None; the awaited reads fill them."""

    @property
    def roles(self) -> RoleReads: ...

    @property
    def identities(self) -> IdentityReads: ...

    @property
    def seal(self) -> Seal:
        """The outbox rows' MAC key (``key_outbox``), which delivery checks them with."""
        ...

    @property
    def space(self) -> Space: ...

    @property
    def needs_touch(self) -> Callable[[Key, datetime], bool]: ...

    @property
    def count_use(self) -> Callable[[str, datetime, int], None]: ...

    def transaction(
        self, operation: str, timed: bool = True
    ) -> AbstractAsyncContextManager[Connection]:
        """One write transaction, its duration observed as ``operation``'s unless not
        ``timed`` (one whose duration would tell a public caller what it found)."""
        ...

    def authorization_changed(self, conn: Connection) -> Awaitable[None]: ...

    def record(
        self, conn: Connection, activity: Activity, revoking: bool = False
    ) -> Awaitable[None]:
        """Inside a write transaction: log ``activity``; TooManyRequests when its
        organization is past its write budget, unless ``revoking`` (``keysvc.db.quota``)."""
        ...

    def enqueue(
        self,
        conn: Connection,
        organization_id: str,
        event_type: str,
        data: dict[str, Any],
        now: datetime,
        webhook_ids: Collection[str] | None = None,
        revoking: bool = False,
    ) -> Awaitable[None]:
        """Inside a write transaction: an event for the organization's webhooks subscribed
        to ``event_type`` (among ``webhook_ids``, when given), each row MACed with the
        outbox key (``keysvc.db.outbox``); TooManyRequests when a webhook's queue is full
        or the organization is past its write budget (``keysvc.db.quota``). A revocation
        (``revoking``: a key disabled, deleted or reported leaked) is never refused: it
        is counted, and its event queued within a reserve past the limit."""
        ...

    def key_outbox(self, key: bytes) -> None:
        """Key the outbox rows' MACs (from the pepper), before any event is enqueued."""
        ...

    def schema_is_current(self) -> Awaitable[bool]: ...

    def has_organization(self) -> Awaitable[bool]: ...

    def organization_ids(self) -> Awaitable[list[str]]: ...

    def create_key(
        self, new: NewKey, max_keys: int, announce: Announce, recheck: Recheck | None = None
    ) -> Awaitable[Key]: ...

    def data_version(self) -> int:
        """A number that changes whenever anything is committed (``Caches.data_version``)."""
        ...

    def cached_key(self, organization_id: str, key_id: str) -> Key | None:
        """The key, if cached and nothing was committed since it was read; no statement."""
        ...

    def cached_credential(self, key_id_hash: bytes) -> Credential | None:
        """The credential, if cached and authorization has not moved since; no statement."""
        ...

    def proven_credential(self, proof: bytes) -> Credential | None:
        """The credential a checked Authorization header (by its keyed hash) carries."""
        ...

    def remember_proof(self, proof: bytes, key_id_hash: bytes, credential: Credential) -> None:
        """Remember that the header hashed to ``proof`` carries ``credential``."""
        ...

    def cached_page(
        self, key: tuple[object, ...], render: Callable[[], Awaitable[Rendered]]
    ) -> Awaitable[Rendered]:
        """The page rendered for ``key`` as committed now: kept, else ``render()``'s."""
        ...

    def spend_credits(
        self, organization_id: str, key_id: str, now: datetime, rule: SpendRule
    ) -> Awaitable[Spend | None]:
        """Spend from the key's credits as ``rule`` decides, exactly, in one write
        transaction with the events it sends (``keysvc.db.credits``); None when they are
        unlimited. Never from a cache."""
        ...

    def spend_shared(
        self,
        organization_id: str,
        key_id: str,
        external_id: str,
        now: datetime,
        rule: SpendRule,
        identity_rule: SpendRule,
    ) -> Awaitable[Spent]:
        """As ``spend_credits``, from the key's credits and its identity's together, in
        the same batches (issue 36): both enough, or neither spent."""
        ...

    def get_key(self, organization_id: str, key_id: str) -> Awaitable[Key | None]: ...

    def list_keys(
        self, organization_id: str, after: int, limit: int, external_id: str | None = None
    ) -> Awaitable[KeyPage]: ...

    def find_credential(
        self, key_id_hash: bytes, offered: bytes | None = None
    ) -> Awaitable[Credential | None]: ...

    def read_as_uncached(self, key_id_hash: bytes) -> Awaitable[None]: ...

    def keys_with_secret(
        self, conn: Connection, secret_hash: bytes, now: datetime
    ) -> Awaitable[list[SecretHolder]]:
        """Inside a write transaction: the keys whose secret has the keyed hash
        ``secret_hash`` at ``now``, found by it alone (one indexed read), each match
        compared again in constant time; a miss does the same read and one compare."""
        ...

    def note_revoked_use(
        self, key_id: str, moment: datetime, make: Callable[[], RevokedUse]
    ) -> None: ...

    def get_activity(
        self, organization_id: str, activity_id: str
    ) -> Awaitable[Activity | None]: ...

    def list_activities(
        self,
        organization_id: str,
        after: int,
        limit: int,
        since: datetime | None = None,
        until: datetime | None = None,
        kinds: ActivityKinds | None = None,
        max_bytes: int | None = None,
    ) -> Awaitable[ActivityPage]: ...

    def list_webhooks(self, organization_id: str) -> Awaitable[list[Webhook]]: ...

    def get_webhook(self, organization_id: str, webhook_id: str) -> Awaitable[Webhook | None]: ...

    def delivery_page(
        self, webhook_id: str, before: int | None, limit: int
    ) -> Awaitable[tuple[list[Delivery], bool, int]]: ...

    def touch_used(self, key_id: str, minute: datetime) -> Awaitable[None]: ...

    def write_usage(self) -> Awaitable[None]: ...

    def usage_series(
        self, key_id: str, start: datetime, end: datetime, width: int
    ) -> Awaitable[Mapping[str, Sequence[int]]]: ...

    def key_counts(self, every: timedelta, observer: Observer | None) -> KeyCounts:
        """Where the key-state gauge counts: away from the readers authentication uses."""
        ...

    def delivery_reader(self) -> AbstractAsyncContextManager[Connection]:
        """A reader for the background tasks (webhook delivery, pending leak reports),
        whose reads must not wait behind the API's (SQLite: a connection of its own;
        PostgreSQL: the pool)."""
        ...

    def shared_counts(self) -> SharedCountStore | None:
        """The table the instances share their failed-login counts in; None where one
        process serves the database (SQLite), which counts in its own memory."""
        ...
