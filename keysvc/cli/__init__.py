"""The ``keysvc`` command: ``serve``, ``bootstrap``, ``admin-key``, ``backup``,
``audit verify``, ``migrate``, ``revoke-leaked``, ``import`` and ``export``.

Settings come from flags, then KEYSVC_* variables, then defaults (``keysvc.config``).
A setting keysvc cannot use, or a refused backup or migration, stops it with a
one-line reason and exit code 2; a failed copy or check exits 1. Only ``bootstrap``
makes a database: ``serve`` and ``admin-key`` refuse a path where there is none.

A command's own modules are imported when it runs, not before: ``serve`` needs the
app and its listeners (``keysvc.cli.serve``), the commands on keys need the store and
the domain (``keysvc.cli.operator``), and those on the database's files need the tools
of ``keysvc.ops`` (``keysvc.cli.database``). So ``keysvc bootstrap`` starts without
loading aiohttp.
"""

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from keysvc.config import OPTIONS, ConfigError, Settings, build_settings
from keysvc.errors import ApiError
from keysvc.logs import configure_logging

_BOOTSTRAP_FLAGS = ("db_path",)
_ADMIN_KEY_FLAGS = ("db_path", "max_keys_per_org")
_REVOKE_LEAKED_FLAGS = ("db_path", "leaked_key_action")
ADMIN_KEY_NAME = "admin (keysvc admin-key)"


def _add_options(parser: argparse.ArgumentParser, only: Sequence[str] | None = None) -> None:
    for option in OPTIONS:
        if option.flag and (only is None or option.field in only):
            default = option.default or "none"
            parser.add_argument(
                option.flag_name,
                dest=option.field,
                metavar=option.env.removeprefix("KEYSVC_"),
                help=f"{option.help} (env {option.env}, default {default})",
            )


def _parser() -> argparse.ArgumentParser:
    from keysvc import __version__

    env_only = "; ".join(f"{o.env}: {o.help}" for o in OPTIONS if not o.flag)
    parser = argparse.ArgumentParser(
        prog="keysvc",
        description="Self-hosted API key service.",
        epilog=f"Environment only: {env_only}.",
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"keysvc {__version__}",
        help="print keysvc's version and exit",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve the HTTP API", epilog=parser.epilog)
    _add_options(serve)
    boot = commands.add_parser(
        "bootstrap", help="create an organization and its first admin key; prints one JSON object"
    )
    _add_options(boot, _BOOTSTRAP_FLAGS)
    boot.add_argument("--org-name", default="default", help="organization name (default: default)")
    boot.add_argument(
        "--if-empty",
        action="store_true",
        help="do nothing if the database already has an organization",
    )
    admin = commands.add_parser(
        "admin-key",
        help="mint a new admin key for an organization of an existing database, as when"
        " its admin secret is lost; prints one JSON object",
    )
    _add_options(admin, _ADMIN_KEY_FLAGS)
    admin.add_argument(
        "--org",
        metavar="ORG_ID",
        help="the organization's ID (needed when the database holds several)",
    )
    admin.add_argument(
        "--name", default=ADMIN_KEY_NAME, help=f"key name (default: {ADMIN_KEY_NAME})"
    )
    back = commands.add_parser(
        "backup",
        help="copy the database while it serves, with its pepper file; prints one JSON object",
    )
    _add_options(back, _BOOTSTRAP_FLAGS)
    back.add_argument(
        "out", metavar="OUT", type=Path, help="backup file to create (never overwritten)"
    )
    audits = commands.add_parser("audit", help="check the activity log").add_subparsers(
        dest="audit_command", required=True
    )
    verify = audits.add_parser(
        "verify",
        help="check every organization's activity chain with the pepper: exit 0 and one"
        " line when intact, 1 naming the first edited or removed record",
    )
    _add_options(verify, _BOOTSTRAP_FLAGS)
    revoke = commands.add_parser(
        "revoke-leaked",
        help="act on a key's leaked secret, read from standard input (one line; never an"
        " argument, which ps shows): the key is disabled, or with --leaked-key-action"
        " notify left enabled, and the report recorded; prints one JSON object",
    )
    _add_options(revoke, _REVOKE_LEAKED_FLAGS)
    move = commands.add_parser(
        "migrate",
        help="copy a SQLite database whole into an empty PostgreSQL database, checking"
        " every table's row count; prints one line per table. The pepper stays the same:"
        " serve the copy with KEYSVC_PEPPER set to the SQLite pepper file's contents",
    )
    move.add_argument(
        "--from",
        dest="source",
        metavar="PATH",
        type=Path,
        required=True,
        help="the SQLite database file (read only; stop its server first, or the copy is"
        " of the moment the migration began)",
    )
    move.add_argument(
        "--to",
        dest="target",
        metavar="URL",
        required=True,
        help="the PostgreSQL database, postgresql://...: a new one, or one holding nothing",
    )
    _porting(commands)
    return parser


def _porting(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """``import`` and ``export`` (``keysvc.cli.porting``)."""
    into = commands.add_parser(
        "import",
        help="import keys into an organization from a JSON Lines file (one import record a"
        " line, as POST .../keys/import takes them; - for standard input), in batches of one"
        " transaction each; refused lines are listed on standard error by number; prints one"
        " JSON object; exit 1 if any line was refused",
    )
    _add_options(into, _ADMIN_KEY_FLAGS)
    into.add_argument("--org", metavar="ORG_ID", required=True, help="the organization's ID")
    into.add_argument(
        "--batch",
        type=int,
        default=None,
        help="records a transaction (1 to 20000; default 10000 on SQLite, 1000 on PostgreSQL,"
        " where each batch holds every instance's writes while it is written)",
    )
    into.add_argument("file", metavar="FILE", help="the JSON Lines file, or - for standard input")
    out = commands.add_parser(
        "export",
        help="write an organization's keys to standard output as JSON Lines: public fields"
        " only, each line an import record without material (no hash or secret)",
    )
    _add_options(out, _BOOTSTRAP_FLAGS)
    out.add_argument("--org", metavar="ORG_ID", required=True, help="the organization's ID")


def _port(args: argparse.Namespace, settings: Settings) -> int:
    from keysvc.cli import porting

    if args.command == "export":
        porting.export(settings, args.org, sys.stdout)
        return 0
    batch = args.batch
    if batch is None:
        batch = porting.SQLITE_BATCH if settings.db_url is None else porting.POSTGRES_BATCH
    if not 1 <= batch <= porting.MAX_BATCH:
        raise ConfigError(f"import: --batch must be from 1 to {porting.MAX_BATCH}")
    with porting.open_input(args.file) as stream:
        summary, code = porting.import_file(settings, args.org, stream, batch, sys.stderr)
    print(json.dumps(summary))
    return code


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    flags = {o.field: getattr(args, o.field, None) for o in OPTIONS}
    try:
        settings = build_settings(flags)
        # JSON lines from here on; a setting refused above is one plain line.
        configure_logging(settings.log_level, secret_prefix=settings.secret_prefix)
        if args.command == "serve":
            from keysvc.cli import serve

            return serve.run(settings)
        if args.command in ("import", "export"):
            return _port(args, settings)
        if args.command in ("migrate", "backup", "audit"):
            from keysvc.cli import database

            if args.command == "migrate":
                return database.migrate(settings, args.source, args.target)
            if args.command == "backup":
                return database.backup(settings, args.out)
            return database.audit_verify(settings)
        from keysvc.cli import operator

        if args.command == "revoke-leaked":
            secret = operator.read_secret(sys.stdin)
            print(json.dumps(operator.revoke_leaked(settings, secret)))
            return 0
        if args.command == "admin-key":
            print(json.dumps(operator.admin_key(settings, args.org, args.name)))
            return 0
        created = operator.bootstrap(settings, args.org_name, args.if_empty)
    except (ConfigError, OSError) as exc:
        print(f"keysvc: {exc}", file=sys.stderr)
        return 2
    except ApiError as exc:  # a refusal of the domain's, such as the key limit
        print(f"keysvc: {args.command}: {exc.message}", file=sys.stderr)
        return 2
    if created is None:
        print(
            "keysvc: the database already has an organization; nothing bootstrapped",
            file=sys.stderr,
        )
    else:
        print(json.dumps(created))
    return 0
