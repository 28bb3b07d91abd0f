"""The commands on the database's files, run without serving: ``backup`` (a copy
while it serves, with its pepper file), ``audit verify`` (the activity log's hash
chains, ``keysvc.ops.audit``) and ``migrate`` (SQLite copied into an empty PostgreSQL
database, ``keysvc.ops.migrate``)."""

import json
import sys
from pathlib import Path

from keysvc.config import Settings
from keysvc.ops import audit
from keysvc.ops import backup as backups
from keysvc.ops import migrate as migration


def audit_verify(settings: Settings) -> int:
    verdict = audit.verify(settings)
    if verdict.problem is not None:
        print(f"keysvc: audit verify: {verdict.problem}", file=sys.stderr)
        return 1
    print(audit.summary(verdict))
    return 0


def backup(settings: Settings, out: Path) -> int:
    try:
        made = backups.backup(settings, out)
    except backups.BackupError as exc:
        print(f"keysvc: backup: {exc}", file=sys.stderr)
        return exc.exit_code
    if made.pepper_path is None:
        print(
            "keysvc: note: the pepper comes from KEYSVC_PEPPER and is not in the backup;"
            " keep it separately, no key in the backup verifies without it",
            file=sys.stderr,
        )
    print(json.dumps(made.as_json()))
    return 0


def migrate(settings: Settings, source: Path, target: str) -> int:
    return migration.run(settings, source, target, print)
