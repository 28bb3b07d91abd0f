"""The store contract: what the domain, the HTTP layer and the operators' tools may ask
of a database, whichever backend serves it.

``Store`` is the front (``keysvc.db.sqlite.store.Store`` on SQLite,
``keysvc.db.postgres.store.PgStore`` on PostgreSQL); ``Connection`` is what the
SQL functions (``keysvc.db.keys``, ``roles``, ``outbox``...) run their statements on,
inside ``Store.transaction`` or on ``Store.reader``. A backend's failures reach callers
as keysvc's own errors (``keysvc.errors``): ``DatabaseUnavailable``, ``Conflict``,
``InsufficientStorage``, never a driver's exception.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from keysvc.models import (
    Activity,
    ActivityKinds,
    ActivityPage,
    Credential,
    Key,
    KeyPage,
    NewKey,
    RoleDetail,
)

if TYPE_CHECKING:  # the SQL modules below run their statements on ``Connection``
    from keysvc.db.batching import RevokedUse
    from keysvc.db.cache import Caches
    from keysvc.db.keys import Announce, Recheck
    from keysvc.db.quota import Quota
    from keysvc.db.roles import RoleStore
    from keysvc.db.timing import Observer


# The create records of what an organization from before the activity log holds: its
# custom roles, then its keys (``keysvc.domain.activities.pre_log``).
PreLog = Callable[[Sequence[RoleDetail], Sequence[Key], datetime], list[Activity]]
# The body of a created key's ``key.created`` event (``keysvc.http.render.api_key``).
KeyEvent = Callable[[Key], dict[str, Any]]


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


class PointReads(Protocol):
    """Indexed reads of a few rows (SQLite's ``PointReader``, PostgreSQL's pool)."""

    async def rows(self, sql: str, params: Sequence[object]) -> list[Any]: ...


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


class Store(Protocol):
    """A database opened to serve (``keysvc.db.backends.open_store``)."""

    @property
    def reader(self) -> Connection: ...

    @property
    def caches(self) -> Caches: ...

    @property
    def roles(self) -> RoleStore: ...

    @property
    def space(self) -> Space: ...

    @property
    def needs_touch(self) -> Callable[[Key, datetime], bool]: ...

    @property
    def count_use(self) -> Callable[[str, datetime, int], None]: ...

    def transaction(self, operation: str) -> AbstractAsyncContextManager[Connection]: ...

    def authorization_changed(self, conn: Connection) -> Awaitable[None]: ...

    def record(self, conn: Connection, activity: Activity) -> Awaitable[None]: ...

    @property
    def quota(self) -> Quota: ...

    def schema_is_current(self) -> Awaitable[bool]: ...

    def has_organization(self) -> Awaitable[bool]: ...

    def organization_ids(self) -> Awaitable[list[str]]: ...

    def create_key(
        self, new: NewKey, max_keys: int, announce: Announce, recheck: Recheck | None = None
    ) -> Awaitable[Key]: ...

    def get_key(self, organization_id: str, key_id: str) -> Awaitable[Key | None]: ...

    def list_keys(self, organization_id: str, after: int, limit: int) -> Awaitable[KeyPage]: ...

    def find_credential(self, key_id_hash: bytes) -> Awaitable[Credential | None]: ...

    def read_as_uncached(self, key_id_hash: bytes) -> Awaitable[None]: ...

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

    def touch_used(self, key_id: str, minute: datetime) -> Awaitable[None]: ...

    def write_usage(self) -> Awaitable[None]: ...

    def usage_series(
        self, key_id: str, start: datetime, end: datetime, width: int
    ) -> Awaitable[Mapping[str, Sequence[int]]]: ...

    def key_counts(self, every: timedelta, observer: Observer | None) -> KeyCounts:
        """Where the key-state gauge counts: away from the readers authentication uses."""
        ...

    def delivery_reader(self) -> AbstractAsyncContextManager[Connection]:
        """A reader for the webhook delivery task, whose reads must not wait behind the
        API's (SQLite: a connection of its own; PostgreSQL: the pool)."""
        ...

    def shared_counts(self) -> SharedCountStore | None:
        """The table the instances share their failed-login counts in; None where one
        process serves the database (SQLite), which counts in its own memory."""
        ...
