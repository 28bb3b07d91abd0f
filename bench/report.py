"""The benchmark's results: medians, the table, and docs/PERFORMANCE.md.

The table is Markdown, printed as it is written. Each kind of run owns one
section of docs/PERFORMANCE.md between ``<!-- bench:NAME -->`` and
``<!-- /bench:NAME -->`` markers; a run replaces only its own section and
leaves the prose around it alone.
"""

import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.servers import ROOT
from bench.wrk import Result

FAILURE_LIMIT = 0.01  # more than this share of failed responses marks a scenario broken


@dataclass
class Cell:
    """One app in one scenario: its measured rounds, and what was seen around them."""

    rounds: list[Result] = field(default_factory=list)
    rss_kib: int | None = None  # keysvc only: VmRSS after the scenario's last round
    probe_status: int | None = None  # keysvc only: status of one request sent before
    paced_rate: float | None = None  # a paced scenario: the rate asked of hey, req/s

    def median(self, pick: Callable[[Result], float]) -> float:
        return statistics.median(pick(r) for r in self.rounds) if self.rounds else 0.0

    @property
    def requests(self) -> int:
        return sum(r.requests for r in self.rounds)

    @property
    def failures(self) -> int:
        return sum(r.non_2xx + r.socket_errors for r in self.rounds)

    @property
    def broken(self) -> bool:
        return self.requests == 0 or self.failures > FAILURE_LIMIT * self.requests


CellGrid = dict[str, dict[str, Cell]]  # scenario name -> column label -> cell


@dataclass(frozen=True)
class Column:
    """An app as the table names it: a short label and what it is."""

    label: str
    title: str
    keysvc: bool


def machine() -> str:
    cpus = len(os.sched_getaffinity(0))
    model, memory = "unknown CPU", 0
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            memory = int(line.split()[1])
    return (
        f"nproc {cpus}, {model}, {memory / 1024 / 1024:.1f} GiB memory;"
        f" Linux {platform.release()}; Python {platform.python_version()}"
    )


def command(module: str, argv: Sequence[str], make_options: str = "") -> str:
    """How a section was made: ``python -m module argv`` (the checkout's interpreter
    named relative to it), and under make, the ``make bench`` that ran it."""
    python = Path(sys.executable)
    if python.is_relative_to(ROOT):
        python = python.relative_to(ROOT)
    text = f"`{shlex.join([str(python), '-m', module, *argv])}`"
    if os.environ.get("MAKELEVEL"):
        text = f"`make bench{make_options}`, which runs {text}"
    return text


def head_facts(date: str, revision: str, command: str) -> list[tuple[str, str]]:
    """The facts every section starts with: when, on what, which code, by what command."""
    return [
        ("date", date),
        ("machine", machine()),
        ("keysvc", f"commit {revision}; one process, default settings"),
        ("command", command),
    ]


def git_revision(root: Path) -> str:
    program = shutil.which("git")

    def git(*args: str) -> str:
        if program is None:
            return ""
        done = subprocess.run(  # noqa: S603 - a fixed git command, no shell
            [program, "-C", str(root), *args], capture_output=True, text=True, check=False
        )
        return done.stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", "keysvc")
    return head + (" plus uncommitted changes in keysvc/" if dirty else "")


def _rps(result: Result) -> float:
    return result.rps


def _ms(value: float) -> str:
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def _failures(cell: Cell) -> str:
    text = f"{cell.failures:,}"
    if cell.broken:
        share = cell.failures / cell.requests if cell.requests else 1.0
        status = f", probe {cell.probe_status}" if cell.probe_status is not None else ""
        text += f" (**{share:.0%} BROKEN**{status})"
    return text


def table(
    names: Sequence[tuple[str, str]],
    columns: Sequence[Column],
    cells: CellGrid,
    paced: Collection[str] = (),
) -> str:
    """Medians per scenario; each other column's requests/s over the first's, but for
    the ``paced`` scenarios (all apps at one rate), each other column's p99 over the
    first's. Bytes are wrk's only (see bench/hey.py)."""
    ref = columns[0].label
    head = ["scenario"]
    head += [f"{c.label} req/s" for c in columns]
    head += [f"{c.label}/{ref}" for c in columns[1:]]
    head += [f"{c.label} p50 / p99 ms" for c in columns]
    head += [f"{c.label} bytes/resp" for c in columns]
    head += [f"{c.label} non-2xx" for c in columns]
    head += [f"{c.label} RSS MiB" for c in columns if c.keysvc]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, title in names:
        row = [title]
        by = {c.label: cells[name][c.label] for c in columns}
        row += [f"{by[c.label].median(lambda r: r.rps):,.0f}" for c in columns]
        pick: Callable[[Result], float] = (lambda r: r.p99_ms) if name in paced else _rps
        ref_value = by[ref].median(pick)
        for c in columns[1:]:
            ratio = by[c.label].median(pick) / ref_value if ref_value else 0.0
            text = f"{ratio:.2f}" if ratio >= 0.1 else f"{ratio:.3f}"
            row += [f"p99 {text}" if name in paced else text]
        for c in columns:
            cell = by[c.label]
            row.append(
                f"{_ms(cell.median(lambda r: r.p50_ms))} / {_ms(cell.median(lambda r: r.p99_ms))}"
            )
        if name in paced:
            row += ["-"] * len(columns)
        else:
            row += [f"{by[c.label].median(lambda r: r.bytes_per_response):,.0f}" for c in columns]
        row += [_failures(by[c.label]) for c in columns]
        for c in columns:
            if c.keysvc:
                rss = by[c.label].rss_kib
                row.append(f"{rss / 1024:.1f}" if rss is not None else "-")
        rows.append("| " + " | ".join(row) + " |")
    return "\n".join(rows)


def rounds_table(
    names: Sequence[tuple[str, str]], columns: Sequence[Column], cells: CellGrid
) -> str:
    """Every round's requests/s and p99, in the order they ran, to show the noise."""
    rows = ["| scenario | app | req/s (p99 ms) per round |", "|---|---|---|"]
    for name, title in names:
        for c in columns:
            each = ", ".join(f"{r.rps:,.0f} ({_ms(r.p99_ms)})" for r in cells[name][c.label].rounds)
            rows.append(f"| {title} | {c.label} | {each} |")
    return "\n".join(rows)


def write_section(doc: Path, key: str, text: str) -> None:
    """Replace the ``key`` section of ``doc`` (appended if it has none)."""
    start, end = f"<!-- bench:{key} -->", f"<!-- /bench:{key} -->"
    block = f"{start}\n{text.strip()}\n{end}"
    current = doc.read_text() if doc.exists() else "# Performance\n"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.DOTALL)
    if pattern.search(current):
        updated = pattern.sub(lambda _: block, current)
    else:
        updated = current.rstrip("\n") + "\n\n" + block + "\n"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(updated)
