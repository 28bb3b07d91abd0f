"""The middleware scenario (``--only middleware``, or ``python -m bench.middleware``): a
hello-world aiohttp service behind keysvc.client's aiohttp middleware (``auth``), against
the same service with no auth (``plain``), measured by wrk in alternating rounds; the
figure is auth's median requests/s over plain's (target: at least ``TARGET``).

keysvc runs with its default settings (``KEYSVC_VERIFY_REUSE_SECONDS``, 1 s), so the
middleware reuses each key's answer within that bound; the requests rotate through
``--keys`` keys, made through the API with keysvc.client. Every response must be a 200
(the middleware's refusals count as failures). ``--serve`` runs one service: what the
scenario starts as a subprocess."""

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Sequence
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path

import uvloop
from aiohttp import web

from bench import report, seed, wrk
from bench.report import Cell, Column
from bench.servers import ROOT, Server, start_keysvc, stop_servers_on_sigterm
from keysvc.client import Client, Verifier, keysvc_middleware

NAME = "middleware"
TARGET = 0.8
PLAIN = Column("plain", "aiohttp hello world, no auth", False)
AUTH = Column("auth", "the same behind keysvc.client's aiohttp middleware, reuse 1 s", True)
LOOPS = ("asyncio", "uvloop")
VERIFIED = re.compile(
    r'^keysvc_http_requests_total\{[^}]*route="/v1/verify"[^}]*\} ([0-9.]+)$', re.M
)


def service(keysvc: str | None) -> web.Application:
    """Hello world; behind the middleware when ``keysvc`` names keysvc's URL."""

    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="hello\n")

    app = web.Application()
    if keysvc is not None:
        verifier = Verifier(keysvc)
        app.middlewares.append(keysvc_middleware(verifier=verifier))

        async def close(_: web.Application) -> AsyncIterator[None]:
            yield
            await verifier.close()

        app.cleanup_ctx.append(close)
    app.router.add_get("/", hello)
    return app


def serve(args: argparse.Namespace) -> None:
    loop = uvloop.new_event_loop() if args.loop == "uvloop" else None
    app = service(args.keysvc)
    web.run_app(app, host=args.host, port=args.port, access_log=None, print=None, loop=loop)


def _keys(base: str, admin: seed.Credential, count: int, folder: Path) -> Path:
    """``count`` keys made through the API; a wrk request file that rotates through them."""
    lines = []
    with Client(base, admin.key_id, admin.secret) as client:
        org = client.whoami()["organizationId"]
        for number in range(count):
            made = client.create_key(org, {"name": f"bench {number}", "roles": ["developer"]})
            header = Client(base, made["keyId"], made["keySecret"]).authorization
            lines.append(f"GET\t/\t{header}\t")
    path = folder / "middleware.requests"
    path.write_text("\n".join(lines) + "\n")
    return path


def measure(args: argparse.Namespace) -> tuple[dict[str, Cell], list[tuple[str, str]]]:
    """Warm-up of each, then ``args.rounds`` rounds of plain and auth in turn."""
    started, load = time.monotonic(), os.getloadavg()[0]
    wrk_path = wrk.ensure_wrk()
    settings = wrk.WrkSettings(args.threads, args.connections, args.seconds)
    cells = {PLAIN.label: Cell(), AUTH.label: Cell()}
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="keysvc-bench-mw-") as tmp:
        work = Path(tmp)
        db = work / "keysvc.db"
        _, admin = seed.bootstrap(db)
        loop = {"KEYSVC_LOOP": args.loop}
        keysvc = stack.enter_context(start_keysvc(db, work / "keysvc.log", loop))
        requests = _keys(keysvc.base, admin, args.keys, work)
        command = [sys.executable, "-m", "bench.middleware", "--loop", args.loop, "--serve"]
        apps = {
            PLAIN.label: Server("plain", command, work / "plain.log", seed.keysvc_env()),
            AUTH.label: Server(
                "auth", [*command, "--keysvc", keysvc.base], work / "auth.log", seed.keysvc_env()
            ),
        }
        for app in apps.values():
            stack.enter_context(app)
        warm = wrk.WrkSettings(args.threads, args.connections, args.warmup)
        for app in apps.values() if args.warmup else ():
            wrk.run(wrk_path, app.base, requests, warm)
        verifies: list[float] = []
        for _ in range(args.rounds):
            for label, app in apps.items():
                before = _verified(keysvc.base)
                result = wrk.run(wrk_path, app.base, requests, settings)
                cells[label].rounds.append(result)
                if label == AUTH.label:
                    verifies.append((_verified(keysvc.base) - before) / result.seconds)
    facts = [
        ("event loop", f"{args.loop}, keysvc and both services"),
        ("load", f"the machine's load average was {load:.1f} at the start (1 minute)"),
        (
            "wrk",
            f"{wrk.version(wrk_path, '-v')}: `{settings.describe()}`, {args.keys} keys in"
            f" turn; {args.warmup}s warm-up each, then {args.rounds} rounds of plain and auth"
            " in turn; medians shown",
        ),
        (
            "keysvc",
            f"the verify requests that reached it during auth's rounds: median"
            f" {statistics.median(verifies or [0]):,.0f}/s (one per key per bound at most)",
        ),
        ("run time", f"{time.monotonic() - started:.0f}s"),
    ]
    return cells, facts


def _verified(base: str) -> float:
    """How many verify requests reached keysvc so far, by its request metrics."""
    with urllib.request.urlopen(base + "/metrics", timeout=10) as answer:  # noqa: S310 - loopback
        text = answer.read().decode()
    return sum(float(count) for count in VERIFIED.findall(text))


def section(cells: dict[str, Cell], facts: list[tuple[str, str]]) -> str:
    """The table; the figure is the median of each round's auth/plain (the two ran one
    after the other), steadier on a shared machine than the ratio of the medians."""
    plain, auth = (cells[c.label].median(lambda r: r.rps) for c in (PLAIN, AUTH))
    pairs = zip(cells[PLAIN.label].rounds, cells[AUTH.label].rounds, strict=True)
    ratio = statistics.median([a.rps / p.rps if p.rps else 0.0 for p, a in pairs] or [0.0])
    rows = [
        "### The middleware: a Python service verifying with keysvc.client",
        "",
        "| app | what | req/s | p99 ms | failed |",
        "|---|---|---|---|---|",
    ]
    for column in (PLAIN, AUTH):
        cell = cells[column.label]
        p99 = cell.median(lambda r: r.p99_ms)
        rows.append(
            f"| {column.label} | {column.title} | {cell.median(lambda r: r.rps):,.0f}"
            f" | {p99:.1f} | {cell.failures:,} |"
        )
    verdict = "met" if ratio >= TARGET else "NOT met"
    rows += [
        "",
        f"auth/plain: **{ratio:.2f}**, the median of the rounds' (the medians' ratio:"
        f" {auth / plain if plain else 0.0:.2f}); target at least {TARGET}: {verdict}",
        "",
    ]
    rows += [f"- {name}: {text}" for name, text in facts]
    rows += ["", report.rounds_table([(NAME, "hello")], (PLAIN, AUTH), {NAME: cells})]
    return "\n".join(rows)


def run(args: argparse.Namespace, head: Sequence[tuple[str, str]], doc: Path | None) -> bool:
    """Measure, print the section (and write it into ``doc``); whether it is broken."""
    cells, facts = measure(args)
    text = section(cells, [*head, *facts])
    print("\n" + text, flush=True)
    if doc is not None:
        report.write_section(doc, NAME, text)
    return any(cell.broken for cell in cells.values())


SHARED = ("rounds", "seconds", "warmup", "threads", "connections", "loop")


def from_run(run_args: argparse.Namespace, head: Sequence[tuple[str, str]], doc: Path) -> bool:
    """The scenario as ``bench.run --only middleware`` runs it, with its wrk settings."""
    args = _args([])
    for name in SHARED:
        setattr(args, name, getattr(run_args, name))
    return run(args, head, doc)


def _args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.middleware", description=__doc__)
    parser.add_argument("--serve", action="store_true", help="run one service (internal)")
    parser.add_argument("--keysvc", help="--serve: keysvc's URL; without it, no auth")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--loop", choices=LOOPS, default="asyncio")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--doc", type=Path, help="Markdown file to write the section into")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _args(argv)
    if args.serve:
        serve(args)
        return 0
    stop_servers_on_sigterm()
    date = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    command = report.command("bench.middleware", list(sys.argv[1:] if argv is None else argv))
    head = report.head_facts(date, report.git_revision(ROOT), command)
    return 1 if run(args, head, args.doc) else 0


if __name__ == "__main__":
    sys.exit(main())
