"""Run the benchmark and report it: ``python -m bench.run`` (``make bench``).

Default run: A, the bare aiohttp app of bench/baseline.py, against B, a real
``keysvc serve`` on a file database seeded with 1,000 keys (and ``--others``
more that only the admin reads), over every scenario of bench/scenarios.py.
``--keys N`` for N other than 1,000 (``make bench SCALE=1``: 1,000,000) is the
scale check instead: keysvc on 1,000 keys against keysvc on N keys, for GET
and verify. ``--loop uvloop`` (``make bench LOOP=uvloop``) runs every app on
uvloop, so the ratios compare apps on the same loop; it has its own section.

``--backend postgres`` adds C, keysvc on PostgreSQL (bench/postgres.py: a throwaway
cluster, durability at PostgreSQL's defaults), seeded with B's keys; it takes its
turn in every round after B, and a section of its own compares it with B (C/B),
with the target that verify and GET on a cache hit stay within 10% of SQLite.
The default, ``auto``, runs it whenever PostgreSQL is installed; ``sqlite`` never.
The scale check is SQLite's only.

Every app gets a short unrecorded warm-up in each scenario, then the rounds run: each
round runs every scenario, and the apps take turns within it (A, B, C, A, B, C, ...),
with the same wrk settings, so that the scenarios are measured side by side rather than
one after another; the table shows medians over the rounds. The paced scenario follows
the others and reuses verify's result: hey sends verify at half the rate wrk measured
for keysvc, to each app in turn, and the table compares their p99. The table is printed and
written to docs/PERFORMANCE.md. The exit code is 1 when more than 1% of an
app's responses in a scenario were not 2xx (or were socket errors), so a
broken scenario cannot pass for a slow one.
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from bench import (
    forward,
    hey,
    importing,
    middleware,
    postgres,
    replicas,
    report,
    scenarios,
    seed,
    targets,
    wrk,
)
from bench.report import Cell, CellGrid, Column
from bench.scenarios import Scenario
from bench.servers import ROOT, Server, start_baseline, start_keysvc, stop_servers_on_sigterm
from keysvc.config import LOOPS, Settings

DEFAULT_KEYS = 1000
# More keys than keysvc's credential cache holds by default, so that no cache of
# that size could keep the admin's rotation over them: every read misses.
DEFAULT_OTHERS = 2 * Settings().cache_size
PACED_SHARE = 0.5  # the paced rate, as a share of keysvc's peak measured by wrk
SCALE_SCENARIOS = ("get", "verify")
BACKENDS = ("auto", "sqlite", "postgres")
# The PostgreSQL target: C/B of these scenarios (a cache hit) at least this.
POSTGRES_TARGET = 0.90
POSTGRES_TARGETED = ("verify", "get")
DOC = ROOT / "docs" / "PERFORMANCE.md"


@dataclass(frozen=True)
class App:
    column: Column
    server: Server
    seeded: seed.Seeded
    files: dict[str, Path]  # scenario name -> request file for rotate.lua


def _args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.run", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument(
        "--keys",
        type=int,
        default=DEFAULT_KEYS,
        help="keys to seed; other than 1000 runs the scale check (default 1000)",
    )
    parser.add_argument("--rounds", type=int, default=5, help="rounds per app (default 5)")
    parser.add_argument("--seconds", type=int, default=5, help="seconds per round (default 5)")
    parser.add_argument("--warmup", type=int, default=2, help="warm-up seconds (default 2)")
    parser.add_argument("--threads", type=int, default=1, help="wrk threads (default 1)")
    parser.add_argument("--connections", type=int, default=32, help="wrk connections (32)")
    parser.add_argument("--rotate", type=int, default=1000, help="keys to rotate through (1000)")
    parser.add_argument(
        "--others",
        type=int,
        default=DEFAULT_OTHERS,
        help=f"keys seeded for the admin to read, never authenticating ({DEFAULT_OTHERS})",
    )
    parser.add_argument("--paced-workers", type=int, default=16, help="hey workers (16)")
    parser.add_argument(
        "--loop", choices=LOOPS, default="asyncio", help="event loop of every app (asyncio)"
    )
    parser.add_argument(
        "--only",
        help="comma-separated scenarios to run (of "
        + ", ".join([*(s.name for s in scenarios.SCENARIOS), forward.NAME])
        + "); all by default; verify-paced needs verify; forward-auth runs nginx in front"
        " of a static file four ways (bench/forward.py); middleware, alone and only when"
        " named, a service behind keysvc.client's middleware (bench/middleware.py);"
        " importing, alone, keysvc import and the import API on a generated file of"
        " 1,000,000 keys (bench/importing.py; a default run ends with it); replicas, alone, the"
        " capacity point on PostgreSQL with a standby (bench/replicas.py: --keys"
        " defaults to 10 million there, written to"
        " docs/CAPACITY.md)",
    )
    parser.add_argument(
        "--forward-keys",
        type=int,
        default=forward.DEFAULT_KEYS,
        help=f"keys forward-auth's requests rotate through ({forward.DEFAULT_KEYS})",
    )
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="auto",
        help="sqlite: A and B; postgres: C too, keysvc on PostgreSQL; auto (the default):"
        " postgres when PostgreSQL's initdb is installed, else sqlite",
    )
    parser.add_argument("--workdir", type=Path, help="keep databases and logs here")
    parser.add_argument("--doc", type=Path, default=DOC, help="Markdown file to update")
    return parser.parse_args(argv)


def _command(argv: Sequence[str], args: argparse.Namespace) -> str:
    options = " SCALE=1" if "--keys" in argv else ""
    options += f" LOOP={args.loop}" if "--loop" in argv else ""
    options += f" BACKEND={args.backend}" if "--backend" in argv else ""
    return report.command("bench.run", argv, options)


def _seed(
    work: Path, keys: int, rotate: int, others: int = 0, url: str = ""
) -> tuple[seed.Seeded, float]:
    """Seed a file in its own folder of ``work``, or the PostgreSQL database at ``url``
    (its request files in a folder of ``work`` all the same)."""
    folder = work / (f"postgres-keys-{keys}" if url else f"keys-{keys}")
    folder.mkdir(parents=True)
    started = time.monotonic()
    if url:
        seeded = seed.seed_postgres(url, postgres.PEPPER, keys, rotate, others=others)
    else:
        seeded = seed.seed(folder / "keysvc.db", keys, rotate, others=others)
    seed.write(seeded, folder)
    elapsed = time.monotonic() - started
    where = " on PostgreSQL" if url else ""
    print(f"bench: seeded {keys:,} keys{where} in {elapsed:.1f}s", flush=True)
    return seeded, elapsed


def _files(seeded: seed.Seeded, chosen: Sequence[Scenario], folder: Path) -> dict[str, Path]:
    return {s.name: scenarios.write_requests(s, seeded, folder / f"{s.name}.tsv") for s in chosen}


@dataclass(frozen=True)
class Plan:
    """How every scenario is driven: wrk flat out, or hey at a fixed rate."""

    wrk_path: str
    settings: wrk.WrkSettings
    rounds: int
    warmup: int
    hey_path: str | None = None  # None: no paced scenario chosen
    paced_workers: int = 16


def measure(plan: Plan, apps: Sequence[App], chosen: Sequence[Scenario]) -> CellGrid:
    """Every chosen scenario: those run flat out first, their rounds interleaved
    (``_flat_out``), then the paced ones, which need their flat-out scenario's peak."""
    grid: CellGrid = {s.name: {a.column.label: Cell() for a in apps} for s in chosen}
    flat = [scenario for scenario in chosen if not scenario.paced]
    for scenario in flat:
        _probe(apps, scenario, grid)
    _flat_out(plan, apps, flat, grid)
    for scenario in chosen:
        if scenario.paced:
            _probe(apps, scenario, grid)
            _paced(plan, apps, scenario, grid)
            _rss(apps, scenario, grid)
    return grid


def _probe(apps: Sequence[App], scenario: Scenario, grid: CellGrid) -> None:
    """keysvc's status for the scenario's first request, before it is measured."""
    print(f"bench: {scenario.name}: {scenario.title}", flush=True)
    for app in apps:
        if app.column.keysvc:
            line = scenario.lines(app.seeded)[0]
            status = scenarios.probe(app.server.base, line).status
            grid[scenario.name][app.column.label].probe_status = status
            if not 200 <= status < 300:
                print(f"bench:   {app.column.label} answers {status} here", flush=True)


def _rss(apps: Sequence[App], scenario: Scenario, grid: CellGrid) -> None:
    """keysvc's resident memory just after the scenario's last round."""
    for app in apps:
        if app.column.keysvc:
            grid[scenario.name][app.column.label].rss_kib = app.server.rss_kib()


def _flat_out(plan: Plan, apps: Sequence[App], chosen: Sequence[Scenario], grid: CellGrid) -> None:
    """wrk flat out: a warm-up per app and scenario, then round by round, every scenario
    in each round, the apps in turn within it. Interleaved so that the scenarios are
    measured side by side: a machine that speeds up or slows down over the run (its
    other load) moves every scenario's rounds alike, where one scenario's rounds after
    another's took the drift for a difference between them."""
    for scenario in chosen:
        for app in apps:
            if plan.warmup:
                quick = replace(plan.settings, seconds=plan.warmup)
                wrk.run(plan.wrk_path, app.server.base, app.files[scenario.name], quick)
                app.server.check_alive()
    for number in range(1, plan.rounds + 1):
        for scenario in chosen:
            seen = []
            for app in apps:
                result = wrk.run(
                    plan.wrk_path, app.server.base, app.files[scenario.name], plan.settings
                )
                app.server.check_alive()
                grid[scenario.name][app.column.label].rounds.append(result)
                seen.append(f"{app.column.label} {result.rps:,.0f} req/s")
            print(
                f"bench:   round {number}/{plan.rounds}, {scenario.name}: {', '.join(seen)}",
                flush=True,
            )
            if number == plan.rounds:
                _rss(apps, scenario, grid)


def _paced(plan: Plan, apps: Sequence[App], scenario: Scenario, grid: CellGrid) -> None:
    """hey at ``PACED_SHARE`` of keysvc's peak of the route (its flat-out scenario,
    measured just before in this run), to each app in turn: the same rate for all."""
    assert plan.hey_path is not None
    keysvc = next(app for app in apps if app.column.keysvc)
    peak = grid[scenario.calls][keysvc.column.label].median(lambda r: r.rps)
    if not peak:
        raise RuntimeError(f"bench: {scenario.name}: {scenario.calls} measured no peak")
    paced = hey.PacedSettings(PACED_SHARE * peak, plan.paced_workers, plan.settings.seconds)
    print(f"bench:   {paced.rate:,.0f} req/s, half of {peak:,.0f}", flush=True)
    cells = grid[scenario.name]
    for app in apps:
        cells[app.column.label].paced_rate = paced.rate
        if plan.warmup:
            line = scenario.lines(app.seeded)[0]
            hey.run(plan.hey_path, app.server.base, line, replace(paced, seconds=plan.warmup))
            app.server.check_alive()
    for number in range(1, plan.rounds + 1):
        seen = []
        for app in apps:
            result = hey.run(plan.hey_path, app.server.base, scenario.lines(app.seeded)[0], paced)
            app.server.check_alive()
            cells[app.column.label].rounds.append(result)
            seen.append(f"{app.column.label} p99 {result.p99_ms:.2f} ms")
        print(f"bench:   round {number}/{plan.rounds}: {', '.join(seen)}", flush=True)


def _main_apps(stack: ExitStack, work: Path, args: argparse.Namespace) -> tuple[list[App], str]:
    others = max(args.others, 1)  # get-other needs one key to read
    seeded, seconds = _seed(work, DEFAULT_KEYS, args.rotate, others)
    loop = {"KEYSVC_LOOP": args.loop}
    keysvc = stack.enter_context(start_keysvc(seeded.db, work / "keysvc.log", loop))
    shapes_file = scenarios.capture_shapes(keysvc.base, seeded, work / "shapes.json")
    baseline = stack.enter_context(start_baseline(shapes_file, work / "baseline.log", args.loop))
    files = _files(seeded, scenarios.SCENARIOS, work / f"keys-{DEFAULT_KEYS}")
    a = Column("A", "bare aiohttp baseline, bench/baseline.py", False)
    b = Column("B", f"`keysvc serve` on 1,000 seeded keys and {others:,} only read", True)
    apps = [App(a, baseline, seeded, files), App(b, keysvc, seeded, files)]
    seeding = f"{DEFAULT_KEYS:,} keys and {others:,} only read seeded in {seconds:.1f}s"
    return apps, seeding


@dataclass(frozen=True)
class OnPostgres:
    """App C, and what the PostgreSQL section says of its cluster and seeding."""

    app: App
    version: str
    seeding: str


def _postgres_app(
    stack: ExitStack, work: Path, args: argparse.Namespace, bindir: Path
) -> OnPostgres:
    """C: ``keysvc serve`` on a throwaway cluster, seeded with B's keys (the same seed)."""
    cluster = stack.enter_context(postgres.Cluster(bindir))
    others = max(args.others, 1)
    seeded, seconds = _seed(work, DEFAULT_KEYS, args.rotate, others, cluster.url)
    settings = {"KEYSVC_LOOP": args.loop, "KEYSVC_PEPPER": postgres.PEPPER}
    log = work / "keysvc-postgres.log"
    server = stack.enter_context(start_keysvc(seeded.db, log, settings, "keysvc (PostgreSQL)"))
    scenarios.touch(server.base, seeded)  # as B's were, before its answers were captured
    files = _files(seeded, scenarios.SCENARIOS, work / f"postgres-keys-{DEFAULT_KEYS}")
    title = f"`keysvc serve` on PostgreSQL, the same 1,000 keys and {others:,} only read"
    app = App(Column("C", title, True), server, seeded, files)
    seeding = f"{DEFAULT_KEYS:,} keys and {others:,} only read seeded in {seconds:.1f}s"
    return OnPostgres(app, cluster.version(), seeding)


def _postgres_bin(args: argparse.Namespace) -> Path | None:
    """PostgreSQL's server commands when the run has a C; None when it has none."""
    if args.backend == "sqlite" or args.keys != DEFAULT_KEYS:
        if args.backend == "postgres":
            raise SystemExit("bench: --backend postgres: the scale check (--keys) is SQLite's")
        return None
    bindir = postgres.server_bin()
    if bindir is None and args.backend == "postgres":
        raise SystemExit("bench: --backend postgres: install PostgreSQL (initdb is missing)")
    return bindir


def _scale_apps(stack: ExitStack, work: Path, args: argparse.Namespace) -> tuple[list[App], str]:
    chosen = [scenarios.BY_NAME[name] for name in SCALE_SCENARIOS]
    small, _ = _seed(work, DEFAULT_KEYS, args.rotate)
    large, seconds = _seed(work, args.keys, args.rotate)
    apps = []
    for seeded, label in ((small, "1k"), (large, _short(args.keys))):
        log = work / f"keysvc-{seeded.keys}.log"
        server = stack.enter_context(start_keysvc(seeded.db, log, {"KEYSVC_LOOP": args.loop}))
        scenarios.touch(server.base, seeded)
        title = f"`keysvc serve` on {seeded.keys:,} seeded keys"
        files = _files(seeded, chosen, work / f"keys-{seeded.keys}")
        apps.append(App(Column(label, title, True), server, seeded, files))
    return apps, f"{args.keys:,} keys seeded in {seconds:.1f}s"


def _short(keys: int) -> str:
    for size, suffix in ((1_000_000, "M"), (1_000, "k")):
        if keys >= size and keys % size == 0:
            return f"{keys // size}{suffix}"
    return str(keys)


def _title(scenario: Scenario, grid: CellGrid) -> str:
    """The scenario's title, with the rate asked of hey where it was paced."""
    if not scenario.paced:
        return scenario.title
    rates = [cell.paced_rate for cell in grid[scenario.name].values() if cell.paced_rate]
    return scenario.title.format(rate=f"{rates[0]:,.0f}" if rates else "?")


def _section(
    heading: str,
    apps: Sequence[App],
    chosen: Sequence[Scenario],
    grid: CellGrid,
    facts: list[tuple[str, str]],
) -> str:
    names = [(s.name, _title(s, grid)) for s in chosen]
    columns = [app.column for app in apps]
    paced = [s.name for s in chosen if s.paced]
    lines = [f"## {heading}", ""]
    lines += [f"- {name}: {value}" for name, value in facts]
    lines += [f"- {c.label}: {c.title}" for c in columns]
    lines += ["", report.table(names, columns, grid, paced), "", "Every round:", ""]
    lines += [report.rounds_table(names, columns, grid)]
    return "\n".join(lines) + "\n"


def _target(grid: CellGrid, sqlite: str, chosen: Sequence[Scenario]) -> str:
    """Whether C/B of each targeted scenario run is at least ``POSTGRES_TARGET``."""
    seen = []
    for name in POSTGRES_TARGETED:
        if name not in {s.name for s in chosen}:
            continue
        b_cell, c_cell = grid[name][sqlite], grid[name]["C"]
        b = b_cell.median(lambda r: r.rps)
        ratio = c_cell.median(lambda r: r.rps) / b if b else 0.0
        # B and C ran back to back in each round: the rounds' own ratios drift less
        # with the machine's other load than the ratio of the two medians.
        paired = [c.rps / b.rps for b, c in zip(b_cell.rounds, c_cell.rounds, strict=True) if b.rps]
        each = f" (median of the rounds' C/B {statistics.median(paired):.2f})" if paired else ""
        met = "met" if ratio >= POSTGRES_TARGET else "MISSED"
        seen.append(f"{name} {ratio:.2f}{each}, {met}")
    return (
        f"verify and GET on a cache hit (get: each key reading itself) within 10% of SQLite,"
        f" C/B >= {POSTGRES_TARGET:.2f}: " + ("; ".join(seen) or "not run")
    )


def _postgres_section(
    heading: str,
    sqlite: App,
    on_postgres: OnPostgres,
    chosen: Sequence[Scenario],
    grid: CellGrid,
    facts: list[tuple[str, str]],
) -> str:
    """B and C side by side from the same run as the section of A and B, C/B ratios."""
    label = sqlite.column.label
    extra = [
        ("target", _target(grid, label, chosen)),
        (
            "PostgreSQL",
            f"{on_postgres.version}: a throwaway cluster the run starts in a temporary folder"
            " (as nobody when root), on 127.0.0.1; durability at PostgreSQL's defaults"
            " (fsync, synchronous_commit, full_page_writes on), as B runs SQLite with"
            " synchronous=FULL; C's RSS is keysvc's, not PostgreSQL's",
        ),
    ]
    mine = [(name, on_postgres.seeding if name == "seeding" else value) for name, value in facts]
    heading = heading.replace(
        "Baseline (A) vs keysvc (B)", "keysvc on SQLite (B) vs PostgreSQL (C)"
    )
    return _section(heading, [sqlite, on_postgres.app], chosen, grid, extra + mine)


def _forward(
    argv: Sequence[str],
    args: argparse.Namespace,
    settings: wrk.WrkSettings,
    date: str,
    revision: str,
) -> bool:
    """The forward-auth scenario (bench/forward.py), its section written; whether any of
    its setups is broken."""
    started, load = time.monotonic(), os.getloadavg()[0]
    wrk_path, hey_path = wrk.ensure_wrk(), hey.ensure_hey()
    with ExitStack() as stack:
        if args.workdir is not None:
            args.workdir.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="keysvc-bench-forward-", dir=args.workdir))
        if args.workdir is None:
            stack.callback(shutil.rmtree, work, ignore_errors=True)
        running = forward.start(stack, work, args.forward_keys, args.loop)
        grid, rate = forward.measure(
            wrk_path, hey_path, settings, args.rounds, args.warmup, args.paced_workers, running
        )
    facts = [
        *report.head_facts(date, revision, _command(argv, args)),
        ("event loop", f"keysvc on {args.loop} (`KEYSVC_LOOP`)"),
        ("load", f"the machine's load average was {load:.1f} at the start (1 minute)"),
        (
            "wrk",
            f"{wrk.version(wrk_path, '-v')}: `{settings.describe()}` through each nginx;"
            f" {args.warmup}s warm-up each, then {args.rounds} rounds of the four in turn;"
            " medians shown",
        ),
        ("run time", f"{time.monotonic() - started:.0f}s"),
    ]
    text = forward.section(grid, rate, facts, args.forward_keys)
    print("\n" + text, flush=True)
    key = "forward" + ("" if args.loop == "asyncio" else f"-{args.loop}")
    report.write_section(args.doc, key, text)
    broken = [(name, label) for name, row in grid.items() for label, c in row.items() if c.broken]
    for name, label in broken:
        print(f"bench: BROKEN: {label} {name}", file=sys.stderr)
    return bool(broken)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _args(argv)
    stop_servers_on_sigterm()
    started = time.monotonic()
    date = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    revision = report.git_revision(ROOT)  # now: the code the servers are about to load
    if args.only == importing.NAME:
        return importing.main(["--doc", str(args.doc)])
    if args.only == middleware.NAME:
        head = report.head_facts(date, revision, _command(argv, args))
        return 1 if middleware.from_run(args, head, args.doc) else 0
    if args.only == replicas.NAME:
        keys = args.keys if args.keys != DEFAULT_KEYS else replicas.DEFAULT_KEYS
        doc = args.doc if args.doc != DOC else replicas.DOC
        return replicas.from_run(keys, args.seconds, args.threads, args.connections, doc)
    settings = wrk.WrkSettings(args.threads, args.connections, args.seconds)
    scale = args.keys != DEFAULT_KEYS
    some = SCALE_SCENARIOS if scale else None  # None: every scenario
    chosen = [s for s in scenarios.SCENARIOS if some is None or s.name in some]
    forward_auth = not scale
    if args.only:
        wanted = set(args.only.split(","))
        forward_auth = forward_auth and forward.NAME in wanted
        wanted.discard(forward.NAME if forward_auth else "")
        if wanted - {s.name for s in chosen}:
            known = [s.name for s in chosen] + ([forward.NAME] if not scale else [])
            raise SystemExit(f"bench: --only: choose from {', '.join(known)}")
        chosen = [s for s in chosen if s.name in wanted]
    names = {s.name for s in chosen}
    for scenario in chosen:
        if scenario.paced and scenario.calls not in names:
            raise SystemExit(f"bench: {scenario.name} paces {scenario.calls}: choose both")
    forward_broken = forward_auth and _forward(argv, args, settings, date, revision)
    if not chosen:
        return 1 if forward_broken else 0
    started = time.monotonic()
    pacing = any(s.paced for s in chosen)
    pg_bin = _postgres_bin(args)
    on_postgres: OnPostgres | None = None
    plan = Plan(
        wrk.ensure_wrk(),
        settings,
        args.rounds,
        args.warmup,
        hey.ensure_hey() if pacing else None,
        args.paced_workers,
    )
    with ExitStack() as stack:
        work = args.workdir or Path(tempfile.mkdtemp(prefix="keysvc-bench-"))
        if args.workdir is None:
            stack.callback(shutil.rmtree, work, ignore_errors=True)
        work.mkdir(parents=True, exist_ok=True)
        if scale:
            apps, seeding = _scale_apps(stack, work, args)
        else:
            apps, seeding = _main_apps(stack, work, args)
            if pg_bin is not None:
                on_postgres = _postgres_app(stack, work, args, pg_bin)
        grid = measure(plan, [*apps, *([on_postgres.app] if on_postgres else [])], chosen)
    every = [*apps, *([on_postgres.app] if on_postgres else [])]
    order = ", ".join([c.column.label for c in every] * 2) + ", ..."
    facts = [
        *report.head_facts(date, revision, _command(argv, args)),
        ("event loop", f"{args.loop}, every app (`--loop`; keysvc's `KEYSVC_LOOP`)"),
        (
            "wrk",
            f"{wrk.version(plan.wrk_path, '-v')}: `{settings.describe()}` against 127.0.0.1;"
            f" {args.warmup}s warm-up per app and scenario, then {args.rounds} rounds, each of"
            f" every scenario, the apps in turn ({order}); medians shown",
        ),
    ]
    if plan.hey_path is not None:
        paced = hey.PacedSettings(0, args.paced_workers, args.seconds)
        facts.append(
            (
                "hey",
                f"{hey.version()}: `{paced.describe()}` against 127.0.0.1, RATE"
                f" {PACED_SHARE:g} of B's median verify req/s above, one key's credentials;"
                f" {args.warmup}s warm-up, then {args.rounds} rounds per app in turn; p50 and"
                " p99 to 0.1 ms",
            )
        )
    facts += [
        ("seeding", seeding),
        ("run time", f"{time.monotonic() - started:.0f}s"),
    ]
    if scale:
        heading = f"Scale: keysvc on 1,000 vs {args.keys:,} keys"
        key = "scale"
    else:
        heading = "Baseline (A) vs keysvc (B), 1,000 keys"
        key = "main"
    if args.loop != "asyncio":
        heading += f", every app on {args.loop}"
        key += f"-{args.loop}"
    issue36 = [] if scale else [("target", line) for line in targets.lines(grid, names)]
    text = _section(heading, apps, chosen, grid, [*issue36, *facts])
    print("\n" + text, flush=True)
    report.write_section(args.doc, key, text)
    if on_postgres is not None:
        pg_key = "postgres" + key.removeprefix("main")
        pg_text = _postgres_section(heading, apps[1], on_postgres, chosen, grid, facts)
        print("\n" + pg_text, flush=True)
        report.write_section(args.doc, pg_key, pg_text)
    print(f"bench: wrote {args.doc}", flush=True)
    broken = [
        (scenario.name, app.column.label, grid[scenario.name][app.column.label])
        for scenario in chosen
        for app in every
        if grid[scenario.name][app.column.label].broken
    ]
    for name, label, cell in broken:
        print(
            f"bench: BROKEN: {label} {name}: {cell.failures:,} of {cell.requests:,} responses"
            f" failed (non-2xx or socket errors; probe answered {cell.probe_status})",
            file=sys.stderr,
        )
    # The import's speed (issue 37), last: a token that does not verify fails the run.
    import_failed = not args.only and not scale and importing.main(["--doc", str(args.doc)], False)
    return 1 if broken or forward_broken or import_failed else 0


if __name__ == "__main__":
    sys.exit(main())
