"""The one place that chooses a backend: the store opened on what a setting names,
SQLite's file (``keysvc.db.sqlite.store``), the default, or a PostgreSQL database
(``keysvc.db.postgres.store``) when ``--db`` is a URL.

PostgreSQL's driver is an extra (``pip install keysvc[postgres]``): it is imported
only when a URL asks for it, so that serving on SQLite needs none.
"""

import importlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from keysvc.config import ConfigError, Settings
from keysvc.credentials import ACTIVITY_CHAIN, OUTBOX_SEAL, PEER_ACKNOWLEDGEMENTS, Hasher
from keysvc.db import contract
from keysvc.db.activities import Verdict
from keysvc.db.contract import NO_RECORDS, Records
from keysvc.db.core import upkeep_of
from keysvc.db.sqlite import audit as sqlite_audit
from keysvc.db.sqlite import connections as sqlite_connections
from keysvc.db.sqlite.store import open_checked
from keysvc.db.timing import Observer

NEEDS_DRIVER = "PostgreSQL needs its driver: pip install 'keysvc[postgres]' (asyncpg)"
NEEDS_PEPPER = (
    "a PostgreSQL database needs KEYSVC_PEPPER: every instance serving it must have the"
    " same pepper, and there is no file beside the database to keep it in"
)


def with_driver(module: str) -> ModuleType:
    """A module of PostgreSQL's, which needs its driver (an extra)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(NEEDS_DRIVER) from None


@asynccontextmanager
async def open_store(
    settings: Settings,
    *,
    observer: Observer | None = None,
    create: bool = True,
    serving: bool = False,
    records: Records = NO_RECORDS,
) -> AsyncIterator[tuple[contract.Store, Hasher]]:
    """The store on the backend ``settings`` names, migrated, writable and checked
    against its pepper; closed on exit. ``records``: what it writes that the layers
    above shape (``keysvc.db.contract.Records``)."""
    if settings.db_url is None:
        async with open_checked(
            settings, observer=observer, create=create, serving=serving, records=records
        ) as (store, hasher):
            yield store, hasher
        return
    if settings.pepper is None:
        raise ConfigError(NEEDS_PEPPER)
    postgres = with_driver("keysvc.db.postgres.store")
    hasher = Hasher(settings.pepper, settings.secret_prefix)
    try:
        store = await postgres.PgStore.open_url(
            settings.db_url,
            observer=observer,
            cache_size=settings.cache_size,
            create=create,
            records=records,
            peer_key=hasher.derive(PEER_ACKNOWLEDGEMENTS),
            replicas=postgres.Replicas(
                settings.pg_replicas, settings.pg_replica_max_lag, settings.pg_listen_url
            ),
            # Only a served store is an instance that writers wait for (rt63 F2).
            registered=serving,
        )
    except postgres.CONNECT_ERRORS as exc:
        reason = str(exc) or type(exc).__name__
        raise ConfigError(f"cannot use the PostgreSQL database: {reason}") from None
    try:
        await store.check_writable()
        await store.check_pepper(hasher.fingerprint())
        store.key_outbox(hasher.derive(OUTBOX_SEAL))
        await store.key_activities(hasher.derive(ACTIVITY_CHAIN))
        if serving:
            await store.start_upkeep(upkeep_of(settings))
        yield store, hasher
    finally:
        await store.close()


def verify_audit(settings: Settings) -> Verdict:
    """``keysvc audit verify`` on the backend ``settings`` names (one snapshot)."""
    if settings.db_url is None:
        return sqlite_audit.verify_file(settings)
    if settings.pepper is None:
        raise ConfigError(NEEDS_PEPPER)
    audit: Any = with_driver("keysvc.db.postgres.audit")
    verdict: Verdict = audit.verify_url(settings.db_url, settings.pepper)
    return verdict


def database_file(settings: Settings, refusal: str) -> Path:
    """The SQLite file ``settings`` names; ConfigError(``refusal``) on PostgreSQL."""
    if settings.db_url is not None:
        raise ConfigError(refusal)
    return settings.db_path


def describe(settings: Settings) -> str:
    """The database as the start-up line names it."""
    return "PostgreSQL" if settings.db_url is not None else str(settings.db_path.absolute())


def warn_if_exposed(settings: Settings) -> None:
    """SQLite's file open beyond its owner is logged (``keysvc.db.sqlite.connections``);
    PostgreSQL's server keeps its own files."""
    if settings.db_url is None:
        sqlite_connections.warn_if_exposed(settings.db_path)
