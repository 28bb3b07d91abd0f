"""The ``keysvc`` command: ``serve``, ``bootstrap`` and ``backup``.

Settings come from flags, then KEYSVC_* environment variables, then defaults
(the table in ``keysvc.config``). A setting keysvc cannot use stops it with a
one-line reason and exit code 2; so does a backup that is refused (its target
exists, say). A backup whose copy fails its integrity check exits 1.
"""

import argparse
import asyncio
import json
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from aiohttp import web

from keysvc import backup, keys, workers
from keysvc.app import create_app
from keysvc.config import OPTIONS, ConfigError, Settings, build_settings
from keysvc.connections import ServiceRunner
from keysvc.logs import configure_logging
from keysvc.state import IN_FLIGHT
from keysvc.store import open_checked
from keysvc.timeutil import utcnow

SHUTDOWN_SECONDS = 5.0
_BOOTSTRAP_FLAGS = ("db_path",)


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
    back = commands.add_parser(
        "backup",
        help="copy the database while it serves, with its pepper file; prints one JSON object",
    )
    _add_options(back, _BOOTSTRAP_FLAGS)
    back.add_argument(
        "out", metavar="OUT", type=Path, help="backup file to create (never overwritten)"
    )
    return parser


async def _bootstrap(settings: Settings, org_name: str, if_empty: bool) -> dict[str, str] | None:
    async with open_checked(settings) as (store, hasher):
        if if_empty and await store.has_organization():
            return None
        org, issued = await keys.bootstrap(store, hasher, org_name, utcnow())
    assert issued.key_id is not None and issued.secret is not None
    return {
        "organizationId": org.id,
        "id": issued.key.id,
        "keyId": issued.key_id,
        "keySecret": issued.secret,
    }


def _backup(settings: Settings, out: Path) -> int:
    try:
        made = backup.make_backup(settings.db_path, out, settings.pepper, settings.pepper_path)
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


def _serve(settings: Settings, reuse_port: bool = False) -> None:
    asyncio.run(_serve_until_stopped(settings, reuse_port))


async def _serve_until_stopped(settings: Settings, reuse_port: bool) -> None:
    """Serve until SIGTERM or SIGINT; then stop accepting, let the requests already
    begun finish (their bodies still read), and close the database.

    Not ``web.run_app``: its shutdown marks every connection closing at once, and
    aiohttp then drops the rest of a request body still arriving (aiohttp#2298),
    so such a request would wait out the timeout unanswered.
    """
    log = logging.getLogger("keysvc")
    app = create_app(settings)
    runner = ServiceRunner(
        app, settings, access_log=None, handle_signals=False, shutdown_timeout=SHUTDOWN_SECONDS
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, settings.host, settings.port, reuse_port=reuse_port or None)
        await site.start()
        log.info("Running on %s (Press CTRL+C to quit)", site.name)
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("stopping: no new connections; finishing %d requests", app[IN_FLIGHT].count)
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
        configure_logging(settings.log_level)
        if args.command == "serve":
            if settings.workers > 1:
                return workers.run(settings, _serve)
            _serve(settings)
            return 0
        if args.command == "backup":
            return _backup(settings, args.out)
        created = asyncio.run(_bootstrap(settings, args.org_name, args.if_empty))
    except (ConfigError, OSError) as exc:
        print(f"keysvc: {exc}", file=sys.stderr)
        return 2
    if created is None:
        print(
            "keysvc: the database already has an organization; nothing bootstrapped",
            file=sys.stderr,
        )
    else:
        print(json.dumps(created))
    return 0
