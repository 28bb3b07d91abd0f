"""The one place that chooses a backend: the store opened on what a setting names,
SQLite's file (``keysvc.db.sqlite.store``), the default, or a PostgreSQL database
(``keysvc.db.postgres.store``) when ``--db`` is a URL.

PostgreSQL's driver is an extra (``pip install keysvc[postgres]``): it is imported
only when a URL asks for it, so that serving on SQLite needs none.
"""

import importlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from keysvc.config import ConfigError, Settings
from keysvc.credentials import ACTIVITY_CHAIN, Hasher
from keysvc.db import contract
from keysvc.db.contract import NO_RECORDS, Records
from keysvc.db.core import upkeep_of
from keysvc.db.sqlite.store import open_checked
from keysvc.db.timing import Observer

NEEDS_PEPPER = (
    "a PostgreSQL database needs KEYSVC_PEPPER: every instance serving it must have the"
    " same pepper, and there is no file beside the database to keep it in"
)


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
    try:
        postgres = importlib.import_module("keysvc.db.postgres.store")
    except ImportError:
        raise ConfigError(
            "PostgreSQL needs its driver: pip install 'keysvc[postgres]' (asyncpg)"
        ) from None
    try:
        store = await postgres.PgStore.open_url(
            settings.db_url,
            observer=observer,
            cache_size=settings.cache_size,
            create=create,
            upkeep=upkeep_of(settings) if serving else None,
            records=records,
        )
    except postgres.CONNECT_ERRORS as exc:
        raise ConfigError(f"cannot use the PostgreSQL database: {exc}") from None
    try:
        await store.check_writable()
        hasher = Hasher(settings.pepper)
        await store.check_pepper(hasher.fingerprint())
        await store.key_activities(hasher.derive(ACTIVITY_CHAIN))
        yield store, hasher
    finally:
        await store.close()
