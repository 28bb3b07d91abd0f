"""``keysvc audit verify``: check every organization's activity chain in a database
file, with the pepper it was made with, and that the keys and custom roles are as
their records leave them (``keysvc.db.activities.verify``, ``keysvc.db.replay``). On a
PostgreSQL database the same checks run through ``keysvc.ops.pgaudit``.

It reads the file only, in one read transaction (one snapshot), so it may run while
keysvc serves. Exit codes: 0 when every chain holds and matches the tables (one
line of summary), 1 naming the first bad record or mismatched key or role, 2 when
it cannot check (no such database, an old schema, a missing or wrong pepper).
"""

import sqlite3
from contextlib import closing

from keysvc.config import ConfigError, Settings
from keysvc.credentials import ACTIVITY_CHAIN, Hasher, load_pepper
from keysvc.db.activities import Chain, Verdict, verify
from keysvc.db.sqlite.connections import require_existing
from keysvc.db.sqlite.migrations import schema_version

_PEPPER = "select value from meta where name = 'pepper'"
# What both backends' checks say (``keysvc.ops.pgaudit`` is PostgreSQL's).
OLD_SCHEMA = (
    "its schema is older than this keysvc's; start `keysvc serve` on it once to"
    " upgrade it, then verify"
)
WRONG_PEPPER = (
    "the pepper does not match this database: give the pepper file or"
    " KEYSVC_PEPPER that was used with it"
)


def verify_file(settings: Settings) -> Verdict:
    path = settings.db_path
    require_existing(path)
    try:
        with closing(sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)) as conn:
            (version,) = conn.execute("pragma user_version").fetchone()
            if version < schema_version():
                raise ConfigError(f"database {path}: {OLD_SCHEMA}")
            recorded = conn.execute(_PEPPER).fetchone()
            pepper = load_pepper(settings.pepper, settings.pepper_path, create=False)
            hasher = Hasher(pepper)
            if recorded is None or recorded[0] != hasher.fingerprint():
                raise ConfigError(WRONG_PEPPER)
            return verify(conn, Chain(hasher.derive(ACTIVITY_CHAIN)))
    except sqlite3.Error as exc:
        raise ConfigError(f"database {path}: cannot be read: {exc}") from None


def summary(verdict: Verdict) -> str:
    return (
        f"audit log intact: {verdict.records} activities in {verdict.organizations} organizations"
    )
