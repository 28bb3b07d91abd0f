"""``keysvc audit verify`` on SQLite's file: every organization's activity chain, with
the pepper it was made with, and the keys and custom roles as their records leave them
(``keysvc.db.activities.verify``, ``keysvc.db.replay``), read in one read transaction
(one snapshot), so it may run while keysvc serves.
"""

import sqlite3
from contextlib import closing

from keysvc.config import ConfigError, Settings
from keysvc.credentials import ACTIVITY_CHAIN, Hasher, load_pepper
from keysvc.db.activities import OLD_SCHEMA, WRONG_PEPPER, Chain, Verdict, verify
from keysvc.db.sqlite.connections import require_existing
from keysvc.db.sqlite.migrations import schema_version

_PEPPER = "select value from meta where name = 'pepper'"


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
