"""The middleware scenario (``--only middleware``, or ``python -m bench.middleware``): a
hello-world aiohttp service behind keysvc.client's aiohttp middleware (``auth``), against
the same service with no auth (``plain``), measured by wrk in alternating rounds; the
figure is auth's median requests/s over plain's (target: at least ``TARGET``).

keysvc runs with its default settings (``KEYSVC_VERIFY_REUSE_SECONDS``, 1 s), so the
middleware reuses each key's answer within that bound; the requests rotate through
``--keys`` keys, made through the API with keysvc.client. Every response must be a 200
(the middleware's refusals count as failures). ``--serve`` runs one service: what the
scenario starts as a subprocess.

The service's CPU a request (``/proc/PID/stat``) is steadier than requests/s on a shared
machine, and keysvc's own CPU is not in it: plain/auth by CPU is reported beside the
ratio. Then a hit and a miss apart, one round each: auth on one key's requests (kept,
but once a bound), and a third service that keeps nothing (``--kept 0``), every request
a verify; with auth's share of misses they say what auth's CPU a request is made of.

Then revocation through the middleware (``--revocations`` keys, made for it, none in
the rotation): while wrk keeps the service busy with the rotation, a thread sends one
key's requests one after the other; once one is served, the key is disabled through
keysvc's API, at a point spread over the kept answer's life, and the delay is from the
API's answer to the first refusal the service answers (target: within keysvc's bound,
``REUSE_SECONDS``), every request after it refused too."""

import argparse
import os
import re
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import AsyncIterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from http.client import HTTPConnection
from pathlib import Path
from urllib.parse import urlsplit

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
REUSE_SECONDS = 1.0  # keysvc's KEYSVC_VERIFY_REUSE_SECONDS at its default: the bound
WATCH_SECONDS = 3.0  # how long a revoked key's requests go on after the API's answer
VERIFIED = re.compile(
    r'^keysvc_http_requests_total\{[^}]*route="/v1/verify"[^}]*\} ([0-9.]+)$', re.M
)


def service(keysvc: str | None, kept: int = 10_000) -> web.Application:
    """Hello world; behind the middleware when ``keysvc`` names keysvc's URL, keeping
    at most ``kept`` answers (0: none, every request asks keysvc)."""

    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="hello\n")

    app = web.Application()
    if keysvc is not None:
        verifier = Verifier(keysvc, max_entries=kept)
        app.middlewares.append(keysvc_middleware(verifier=verifier))

        async def close(_: web.Application) -> AsyncIterator[None]:
            yield
            await verifier.close()

        app.cleanup_ctx.append(close)
    app.router.add_get("/", hello)
    return app


def serve(args: argparse.Namespace) -> None:
    loop = uvloop.new_event_loop() if args.loop == "uvloop" else None
    app = service(args.keysvc, args.kept)
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


@dataclass(frozen=True)
class Revocation:
    """One key disabled while its requests went on: seconds from the API's answer to the
    first refusal answered; 200s answered after the API's (stale); 200s after a refusal."""

    delay: float
    stale: int
    served_after: int


def _watch(service: str, header: str, seen: list[tuple[float, int]], stop: threading.Event) -> None:
    """One request after another with ``header``: each answer's time and status."""
    where = urlsplit(service)
    conn = HTTPConnection(where.hostname or "127.0.0.1", where.port, timeout=30)
    try:
        while not stop.is_set():
            conn.request("GET", "/", headers={"Authorization": header})
            answer = conn.getresponse()
            answer.read()
            seen.append((time.monotonic(), answer.status))
    finally:
        conn.close()


def revoke(base: str, client: Client, org: str, service: str, share: float) -> Revocation:
    """A new key's requests through ``service``; once one is served and ``share`` of the
    bound later, the key disabled; its requests watched for ``WATCH_SECONDS`` more."""
    made = client.create_key(org, {"name": "revoked", "roles": ["developer"]})
    header = Client(base, made["keyId"], made["keySecret"]).authorization
    seen: list[tuple[float, int]] = []
    stop = threading.Event()
    watcher = threading.Thread(target=_watch, args=(service, header, seen, stop), daemon=True)
    watcher.start()
    try:
        deadline = time.monotonic() + 30
        while not any(status == 200 for _, status in seen) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(share * REUSE_SECONDS)
        client.update_key(org, made["key"]["id"], {"state": "disabled"})
        answered = time.monotonic()
        time.sleep(WATCH_SECONDS)
    finally:
        stop.set()
        watcher.join()
    first = next((at for at, status in seen if status != 200), float("inf"))
    return Revocation(
        first - answered,
        sum(1 for at, status in seen if status == 200 and at > answered),
        sum(1 for at, status in seen if status == 200 and at > first),
    )


def revocations(
    args: argparse.Namespace, base: str, admin: seed.Credential, service: str, requests: Path
) -> tuple[list[Revocation], float]:
    """``args.revocations`` keys revoked in turn while wrk keeps ``service`` busy; and
    the requests/s wrk served meanwhile."""
    if args.revocations <= 0:
        return [], 0.0
    seconds = int(args.revocations * (REUSE_SECONDS + WATCH_SECONDS + 1))
    busy = wrk.WrkSettings(args.threads, args.connections, seconds)
    loaded: list[wrk.Result] = []
    load = threading.Thread(
        target=lambda: loaded.append(wrk.run(wrk.ensure_wrk(), service, requests, busy)),
        daemon=True,
    )
    load.start()
    time.sleep(0.5)
    with Client(base, admin.key_id, admin.secret) as client:
        org = client.whoami()["organizationId"]
        count = args.revocations
        found = [revoke(base, client, org, service, number / count) for number in range(count)]
    load.join()
    return found, loaded[0].rps if loaded else 0.0


def _revoked(found: Sequence[Revocation], busy: float) -> str:
    """The revocation fact: each delay, the longest against the bound, what was stale."""
    if not found:
        return "not measured (--revocations 0)"
    longest = max(r.delay for r in found)
    verdict = "met" if longest <= REUSE_SECONDS else "NOT met"
    delays = ", ".join(f"{r.delay:.3f}" for r in found)
    return (
        f"{len(found)} keys disabled through the API in turn, at points spread over their"
        f" kept answers' life, while wrk kept auth busy ({busy:,.0f} req/s): the first"
        f" refusal came {delays} s after the API's answer (longest {longest:.3f} s; target"
        f" within the bound, KEYSVC_VERIFY_REUSE_SECONDS = {REUSE_SECONDS:g} s: {verdict});"
        f" 200s answered after the API's answer {', '.join(str(r.stale) for r in found)};"
        f" 200s after a refusal {sum(r.served_after for r in found)}"
    )


@dataclass(frozen=True)
class Round:
    """One wrk run against a service: wrk's result, the CPU a request cost the service
    and keysvc (µs, from /proc/PID/stat), and the share of requests that reached keysvc."""

    result: wrk.Result
    service_us: float
    keysvc_us: float
    missed: float


def _round(
    wrk_path: str, app: Server, keysvc: Server, requests: Path, settings: wrk.WrkSettings
) -> Round:
    before, used, keysvc_used = _verified(keysvc.base), _cpu(app), _cpu(keysvc)
    result = wrk.run(wrk_path, app.base, requests, settings)
    served = max(result.requests, 1)
    return Round(
        result,
        (_cpu(app) - used) / served * 1e6,
        (_cpu(keysvc) - keysvc_used) / served * 1e6,
        (_verified(keysvc.base) - before) / served,
    )


def measure(args: argparse.Namespace) -> tuple[dict[str, Cell], list[tuple[str, str]]]:
    """Warm-up of each, then ``args.rounds`` rounds of plain and auth in turn; then a
    hit and a miss apart (auth on one key's requests; a service that keeps nothing)."""
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
        one = work / "one.requests"
        one.write_text(requests.read_text().splitlines()[0] + "\n")
        command = [sys.executable, "-m", "bench.middleware", "--loop", args.loop, "--serve"]
        auth = [*command, "--keysvc", keysvc.base]
        env = seed.keysvc_env()
        apps = {
            PLAIN.label: Server("plain", command, work / "plain.log", env),
            AUTH.label: Server("auth", auth, work / "auth.log", env),
        }
        for app in apps.values():
            stack.enter_context(app)
        nothing_kept = stack.enter_context(
            Server("miss", [*auth, "--kept", "0"], work / "miss.log", env)
        )
        warm = wrk.WrkSettings(args.threads, args.connections, args.warmup)
        for app in [*apps.values(), nothing_kept] if args.warmup else ():
            wrk.run(wrk_path, app.base, requests, warm)
        measured: dict[str, list[Round]] = {PLAIN.label: [], AUTH.label: []}
        for _ in range(args.rounds):
            for label, app in apps.items():
                done = _round(wrk_path, app, keysvc, requests, settings)
                cells[label].rounds.append(done.result)
                measured[label].append(done)
        hit = _round(wrk_path, apps[AUTH.label], keysvc, one, settings)
        miss = _round(wrk_path, nothing_kept, keysvc, requests, settings)
        revoked, busy = revocations(args, keysvc.base, admin, apps[AUTH.label].base, requests)
    plain_us = statistics.median(r.service_us for r in measured[PLAIN.label])
    auth_us = statistics.median(r.service_us for r in measured[AUTH.label])
    keysvc_us = statistics.median(r.keysvc_us for r in measured[AUTH.label])
    missed = statistics.median(r.missed for r in measured[AUTH.label])
    facts = [
        ("event loop", f"{args.loop}, keysvc and the services"),
        (
            "load",
            f"the machine's load average (1 minute) was {load:.1f} at the start and"
            f" {os.getloadavg()[0]:.1f} at the end",
        ),
        (
            "wrk",
            f"{wrk.version(wrk_path, '-v')}: `{settings.describe()}`, {args.keys} keys in"
            f" turn; {args.warmup}s warm-up each, then {args.rounds} rounds of plain and auth"
            " in turn; medians shown",
        ),
        (
            "keysvc",
            f"the verify requests that reached it during auth's rounds: median"
            f" {statistics.median(r.missed * r.result.rps for r in measured[AUTH.label]):,.0f}/s"
            f" (one per key per bound at most), {missed:.1%} of auth's requests (misses)",
        ),
        (
            "CPU",
            "a request served, median of the rounds (from /proc/PID/stat): plain"
            f" {plain_us:.0f} us; auth {auth_us:.0f} us in the service and {keysvc_us:.0f} us"
            " in keysvc (its verifies, shared out over auth's requests); plain/auth by CPU"
            f" in the service: **{plain_us / auth_us if auth_us else 0.0:.2f}**",
        ),
        (
            "hit and miss apart",
            f"one round each after those: a hit (auth, one key's requests; {hit.missed:.2%}"
            f" reached keysvc) {hit.service_us:.0f} us a request in the service at"
            f" {hit.result.rps:,.0f} req/s; a miss (the same service keeping nothing, every"
            f" request asks keysvc) {miss.service_us:.0f} us in the service and"
            f" {miss.keysvc_us:.0f} us in keysvc at {miss.result.rps:,.0f} req/s; at auth's"
            f" {missed:.1%} misses those make"
            f" {hit.service_us * (1 - missed) + miss.service_us * missed:.0f} us a request",
        ),
        ("revocation", _revoked(revoked, busy)),
        ("run time", f"{time.monotonic() - started:.0f}s"),
    ]
    return cells, facts


def _cpu(server: Server) -> float:
    """The CPU seconds (user and system) ``server``'s process has used so far."""
    fields = Path(f"/proc/{server.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _verified(base: str) -> float:
    """How many verify requests reached keysvc so far, by its request metrics."""
    with urllib.request.urlopen(base + "/metrics", timeout=10) as answer:  # noqa: S310 - loopback
        text = answer.read().decode()
    return sum(float(count) for count in VERIFIED.findall(text))


def section(cells: dict[str, Cell], facts: list[tuple[str, str]], loop: str = "asyncio") -> str:
    """The table; the figure is the median of each round's auth/plain (the two ran one
    after the other), steadier on a shared machine than the ratio of the medians."""
    plain, auth = (cells[c.label].median(lambda r: r.rps) for c in (PLAIN, AUTH))
    pairs = zip(cells[PLAIN.label].rounds, cells[AUTH.label].rounds, strict=True)
    ratio = statistics.median([a.rps / p.rps if p.rps else 0.0 for p, a in pairs] or [0.0])
    rows = [
        "### The middleware: a Python service verifying with keysvc.client"
        + ("" if loop == "asyncio" else f", on {loop}"),
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
    text = section(cells, [*head, *facts], args.loop)
    print("\n" + text, flush=True)
    if doc is not None:
        report.write_section(doc, NAME + ("" if args.loop == "asyncio" else f"-{args.loop}"), text)
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
    parser.add_argument("--kept", type=int, default=10_000, help="--serve: answers kept")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--loop", choices=LOOPS, default="asyncio")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--revocations", type=int, default=5, help="keys disabled mid-run")
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
