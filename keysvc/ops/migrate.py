"""``keysvc migrate``: a SQLite file (``--from PATH``) copied whole into an empty
PostgreSQL database (``--to postgresql://...``), so that its keys keep working there.
The copy and its checks are the database layer's (``keysvc.db.postgres.fromsqlite``),
loaded only when asked for, as PostgreSQL's driver is an extra.

Exit codes: 0 when copied, with one line per table; otherwise the refusal's
(``MigrateError.exit_code``), and nothing was written.
"""

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from keysvc.config import ConfigError, Settings, is_postgres_url
from keysvc.db.backends import with_driver


def run(settings: Settings, source: Path, target: str, report: Callable[[str], None]) -> int:
    if is_postgres_url(str(source)) or not is_postgres_url(target):
        raise ConfigError(
            "migrate copies a SQLite file (--from PATH) into PostgreSQL (--to postgresql://...)"
        )
    copy: Any = with_driver("keysvc.db.postgres.fromsqlite")
    try:
        asyncio.run(copy.migrate(source, target, settings.pepper, report))
    except copy.MigrateError as exc:
        print(f"keysvc: migrate: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    return 0
