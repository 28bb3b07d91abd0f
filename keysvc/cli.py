"""The ``keysvc`` command: ``serve``, ``bootstrap``, ``admin-key``, ``backup``,
``audit verify``, ``migrate`` and ``revoke-leaked``.

Settings come from flags, then KEYSVC_* variables, then defaults (``keysvc.config``).
A setting keysvc cannot use, or a refused backup or migration, stops it with a
one-line reason and exit code 2; a failed copy or check exits 1. Only ``bootstrap``
makes a database: ``serve`` and ``admin-key`` refuse a path where there is none.
``admin-key`` is the way back in when every admin secret is lost (logged as a
``system`` activity); ``audit verify`` checks the activity log's hash chains
(``keysvc.ops.audit``); ``migrate`` copies SQLite into an empty PostgreSQL database
(``keysvc.ops.migrate``); ``revoke-leaked`` acts on a leaked secret read from standard
input, never from an argument, which every user of the machine can read in ``ps``
(``keysvc.domain.leaks``).
"""

import argparse
import asyncio
import functools
import json
import logging
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

import uvloop

from keysvc.config import OPTIONS, ConfigError, Settings, build_settings
from keysvc.db.backends import open_store
from keysvc.domain import keys, leaks
from keysvc.domain.limits import MAX_LEAKED_SECRET
from keysvc.domain.ratelimit import FailureSketch
from keysvc.errors import ApiError
from keysvc.http import listeners
from keysvc.http.app import STORE_RECORDS, create_app
from keysvc.http.connections import ServiceRunner
from keysvc.http.schemas import CreateKeySchema, load
from keysvc.http.state import IN_FLIGHT
from keysvc.logs import configure_logging
from keysvc.ops import audit, backup, migrate, workers
from keysvc.timeutil import utcnow

SHUTDOWN_SECONDS = 5.0
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
    env_only = "; ".join(f"{o.env}: {o.help}" for o in OPTIONS if not o.flag)
    parser = argparse.ArgumentParser(
        prog="keysvc",
        description="Self-hosted API key service.",
        epilog=f"Environment only: {env_only}.",
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
    return parser


def _audit_verify(settings: Settings) -> int:
    verdict = audit.verify(settings)
    if verdict.problem is not None:
        print(f"keysvc: audit verify: {verdict.problem}", file=sys.stderr)
        return 1
    print(audit.summary(verdict))
    return 0


def _shown(issued: keys.Issued) -> dict[str, str]:
    """A generated key as bootstrap and admin-key print it, its secret shown once."""
    assert issued.key_id is not None and issued.secret is not None
    return {
        "organizationId": issued.key.organization_id,
        "id": issued.key.id,
        "keyId": issued.key_id,
        "keySecret": issued.secret,
    }


async def _bootstrap(settings: Settings, org_name: str, if_empty: bool) -> dict[str, str] | None:
    async with open_store(settings, records=STORE_RECORDS) as (store, hasher):
        if if_empty and await store.has_organization():
            return None
        _, issued = await keys.bootstrap(store, hasher, org_name, utcnow())
    return _shown(issued)


async def _admin_key(settings: Settings, org: str | None, name: str) -> dict[str, str]:
    async with open_store(settings, create=False, records=STORE_RECORDS) as (store, hasher):
        now = utcnow()
        # Checked by the create schema's rules for a name, as any created key's is.
        name = load(CreateKeySchema(now=now), {"name": name, "roles": ["admin"]})["name"]
        issued = await keys.admin_key(store, hasher, org, name, now, settings.max_keys_per_org)
    return _shown(issued)


STDIN_ONLY = "revoke-leaked: give the secret on standard input, one line (not as an argument)"


def _read_secret(stream: IO[str]) -> str:
    """The secret on ``stream``'s first line, without its line end and surrounding blanks;
    ConfigError when there is none or it is longer than any secret keysvc takes."""
    secret = stream.readline(MAX_LEAKED_SECRET + 2).strip()
    if not secret:
        raise ConfigError(STDIN_ONLY)
    if len(secret) > MAX_LEAKED_SECRET:
        raise ConfigError(f"revoke-leaked: the secret is over {MAX_LEAKED_SECRET} characters")
    return secret


async def _revoke_leaked(settings: Settings, secret: str) -> dict[str, bool]:
    """Report ``secret`` leaked as the operator (``keysvc.domain.leaks.CLI_ACTOR``); the
    operator, who holds the database, is told whether it was some key's."""
    async with open_store(settings, create=False, records=STORE_RECORDS) as (store, hasher):
        report = leaks.Report(leaks.CLI, leaks.CLI_ACTOR)
        action = settings.leaked_key_action
        matched = await leaks.report_leak(store, hasher, secret, report, action, utcnow())
    return {"matched": matched}


def _backup(settings: Settings, out: Path) -> int:
    try:
        made = backup.backup(settings, out)
    except backup.BackupError as exc:
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


def loop_factory(settings: Settings) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """What makes the event loop ``serve`` runs on; None is asyncio's own."""
    return uvloop.new_event_loop if settings.loop == "uvloop" else None


def _serve(
    settings: Settings,
    reuse_port: bool = False,
    failures: FailureSketch | None = None,
    unix: socket.socket | None = None,
) -> None:
    # asyncio.run takes a loop_factory only from Python 3.12; Runner has one in 3.11.
    with asyncio.Runner(loop_factory=loop_factory(settings)) as runner:
        runner.run(_serve_until_stopped(settings, reuse_port, failures, unix))


async def _serve_until_stopped(
    settings: Settings,
    reuse_port: bool,
    failures: FailureSketch | None,
    unix: socket.socket | None,
) -> None:
    """Serve until SIGTERM or SIGINT; then stop accepting, let the requests already
    begun finish (their bodies still read), and close the database.

    Not ``web.run_app``: its shutdown marks every connection closing at once, and
    aiohttp then drops the rest of a request body still arriving (aiohttp#2298),
    so such a request would wait out the timeout unanswered.
    """
    log = logging.getLogger("keysvc")
    app = create_app(settings, failures=failures)
    runner = ServiceRunner(
        app, settings, access_log=None, handle_signals=False, shutdown_timeout=SHUTDOWN_SECONDS
    )
    await runner.setup()
    try:
        sites = await listeners.start(runner, settings, reuse_port, unix)
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("stopping: no new connections; finishing %d requests", app[IN_FLIGHT].count)
        for site in sites:
            await site.stop()
        deadline = loop.time() + SHUTDOWN_SECONDS
        while app[IN_FLIGHT].count and loop.time() < deadline:
            await asyncio.sleep(0.02)
    finally:
        await runner.cleanup()  # closes idle connections, then the database
    log.info("stopped")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    flags = {o.field: getattr(args, o.field, None) for o in OPTIONS}
    try:
        settings = build_settings(flags)
        # JSON lines from here on; a setting refused above is one plain line.
        configure_logging(settings.log_level, secret_prefix=settings.secret_prefix)
        if args.command == "serve":
            with listeners.prepared(settings) as unix:
                serve = functools.partial(_serve, unix=unix)
                if settings.workers > 1:
                    return workers.run(settings, serve)
                asyncio.run(workers.prepare(settings))
                serve(settings)
            return 0
        if args.command == "migrate":
            return migrate.run(settings, args.source, args.target, print)
        if args.command == "backup":
            return _backup(settings, args.out)
        if args.command == "audit":
            return _audit_verify(settings)
        if args.command == "revoke-leaked":
            secret = _read_secret(sys.stdin)
            print(json.dumps(asyncio.run(_revoke_leaked(settings, secret))))
            return 0
        if args.command == "admin-key":
            print(json.dumps(asyncio.run(_admin_key(settings, args.org, args.name))))
            return 0
        created = asyncio.run(_bootstrap(settings, args.org_name, args.if_empty))
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
