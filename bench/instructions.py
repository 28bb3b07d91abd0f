"""Instructions per request, counted by callgrind: ``python -m bench.instructions``
(``make bench INSTR=1``).

Requests per second on this shared 2-core machine move by tens of percent
between rounds, so a change of a few percent in keysvc's cost cannot be told
from the weather (docs/PERFORMANCE.md). callgrind counts the instructions a
process executes, every thread of it, and the count depends little on what
else the machine is doing (two runs of the same code agreed to within 2.5%).
This runs A (bench/baseline.py), F (bench/floor.py, read scenarios only) and B
(``keysvc serve``) under callgrind, one at a time, drives each scenario with wrk
after an unrecorded warm-up, and divides the instructions counted during the
measured run by the requests wrk completed. The ratio A/B of instructions per
request is the cost counterpart of B/A in requests per second: 0.5 means
keysvc executes twice the baseline's instructions per request.

Instructions are not time: a cache miss costs more than an instruction, and
wrk's own work and the kernel's are not counted (callgrind sees user space of
the server only). What the count gives is a figure that repeats, so that a
change can be judged by a run of each commit, made side by side. Under
callgrind the server runs 50 to 80 times slower, which changes two things,
both written in the section:

- fewer requests arrive per log-writer batch (the writer gathers for 20 ms),
  so its per-batch cost weighs more per request, in F as in B;
- ``usedAt`` is written at most once a minute per key, so rotating through
  1,000 keys at a few hundred requests a second would make a write of a large
  share of requests; the rotation is 50 keys (``--rotate``). And no counted
  run spans a minute boundary (``wait_before_counting``): the writes of a new
  minute, and the cache they retire, fall outside the count, so that two runs
  of the same code count alike.
"""

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from bench import report, scenarios, seed, wrk
from bench.scenarios import Scenario
from bench.servers import (
    ROOT,
    Server,
    Wrap,
    start_baseline,
    start_floor,
    start_keysvc,
    stop_servers_on_sigterm,
)

DOC = ROOT / "docs" / "PERFORMANCE.md"
FLOOR_SCENARIOS = ("get", "verify", "list")  # as bench.run: the floor writes nothing
START_SECONDS = 300.0  # Python, aiohttp and keysvc's imports, 50 to 80 times slower
STOP_SECONDS = 60.0  # a clean shutdown, and callgrind's last dump, as slow
MINUTE_MARGIN = 2.0  # seconds kept between a counted run and a minute boundary
TOUCH_SECONDS = 3  # a run after a new minute begins, so every key's usedAt is written
# The last line of a finished dump: callgrind writes ``summary:`` in a dump's head,
# before its body, and ``totals:`` only once the body is written.
_TOTALS = re.compile(rb"^totals:\s+(\d+)\n", re.MULTILINE)


def ensure_valgrind() -> str:
    """The path of valgrind, installed from Debian's packages first if it is missing."""
    return wrk.ensure_command("valgrind", "valgrind")


def dump_total(data: bytes) -> int | None:
    """The instruction count of one finished callgrind dump (its ``totals:`` line);
    None while callgrind is still writing it."""
    found = _TOTALS.search(data)
    return int(found.group(1)) if found is not None else None


class Callgrind:
    """A server under callgrind, its counters zeroed and dumped on request."""

    def __init__(self, valgrind: str, out: Path):
        self.out = out
        self.control_path = str(Path(valgrind).with_name("callgrind_control"))
        self.wrap = Wrap(
            [valgrind, "--tool=callgrind", f"--callgrind-out-file={out}", "--dump-instr=no"],
            START_SECONDS,
            STOP_SECONDS,
        )

    def control(self, pid: int, option: str) -> None:
        """``callgrind_control option pid``; an error unless callgrind says it was done."""
        # callgrind_control exits 0 whatever happened: only its "OK." says it was done.
        done = subprocess.run(  # noqa: S603 - callgrind_control beside valgrind, our own pid
            [self.control_path, option, str(pid)],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        if done.returncode != 0 or "OK." not in done.stdout:
            said = (done.stdout + done.stderr).strip()
            raise RuntimeError(f"callgrind_control {option} {pid} failed: {said}")

    def zero(self, server: Server) -> None:
        self.control(server.proc.pid, "--zero")

    def dump(self, server: Server) -> int:
        """The instructions counted since the last zero (or dump), all threads together."""
        before = set(self.out.parent.glob(self.out.name + ".*"))
        self.control(server.proc.pid, "--dump")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            new = set(self.out.parent.glob(self.out.name + ".*")) - before
            totals = [dump_total(path.read_bytes()) for path in sorted(new)]
            if totals and None not in totals:
                for path in new:
                    path.unlink()
                return sum(total for total in totals if total is not None)
            time.sleep(0.2)
        raise RuntimeError(f"callgrind wrote no dump beside {self.out}")


@dataclass
class Count:
    instructions: int = 0
    requests: int = 0
    failures: int = 0

    @property
    def per_request(self) -> float:
        return self.instructions / self.requests if self.requests else 0.0


# (scenario, app label) -> what was counted
Counts = dict[tuple[str, str], Count]


def wait_before_counting(now: float, seconds: float) -> float:
    """Seconds to wait from ``now`` so that a counted run of ``seconds`` begun now keeps
    ``MINUTE_MARGIN`` from any minute boundary; 0 when it already does (``measure_app``
    asks again after the wait and the ``TOUCH_SECONDS`` of load that follow it). A new
    minute makes keysvc write each key's ``usedAt`` once more as the key is next used,
    and those commits retire what it keeps in memory: a count that caught them would
    differ from one that did not."""
    into = now % 60
    if into >= MINUTE_MARGIN and into + seconds + MINUTE_MARGIN < 60:
        return 0.0
    if into < MINUTE_MARGIN:
        return MINUTE_MARGIN - into
    return 60 - into + MINUTE_MARGIN


def measure_app(
    label: str,
    server: Server,
    callgrind: Callgrind,
    files: dict[str, Path],
    chosen: Sequence[Scenario],
    settings: wrk.WrkSettings,
    warmup: int,
    counts: Counts,
) -> None:
    wrk_path = wrk.ensure_wrk()
    for scenario in chosen:
        wrk.run(wrk_path, server.base, files[scenario.name], replace(settings, seconds=warmup))
        while wait := wait_before_counting(time.time(), settings.seconds):
            time.sleep(wait)
            # Every key's usedAt of the new minute is written by this, before counting.
            again = replace(settings, seconds=TOUCH_SECONDS)
            wrk.run(wrk_path, server.base, files[scenario.name], again)
        callgrind.zero(server)
        result = wrk.run(wrk_path, server.base, files[scenario.name], settings)
        instructions = callgrind.dump(server)
        server.check_alive()
        count = Count(instructions, result.requests, result.non_2xx + result.socket_errors)
        counts[(scenario.name, label)] = count
        print(
            f"bench: {label} {scenario.name}: {count.per_request:,.0f} instructions per request"
            f" over {count.requests:,} requests",
            flush=True,
        )


def table(chosen: Sequence[Scenario], labels: Sequence[str], counted: Counts) -> str:
    head = ["scenario"]
    head += [f"{label} instr/req" for label in labels]
    head += [f"A/{label}" for label in labels if label != "A"]
    head += [f"{label} requests" for label in labels]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for scenario in chosen:
        counts = {label: counted.get((scenario.name, label)) for label in labels}
        base = counts.get("A")
        row = [scenario.title]
        row += [f"{c.per_request:,.0f}" if c else "" for c in counts.values()]
        for label, count in counts.items():
            if label == "A":
                continue
            if base is None or count is None or not count.per_request:
                row.append("")
            else:
                row.append(f"{base.per_request / count.per_request:.2f}")
        row += [
            f"{c.requests:,}" + (f" ({c.failures:,} failed)" if c.failures else "") if c else ""
            for c in counts.values()
        ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.instructions",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("--seconds", type=int, default=15, help="measured seconds (15)")
    parser.add_argument("--warmup", type=int, default=8, help="warm-up seconds (8)")
    parser.add_argument("--connections", type=int, default=8, help="wrk connections (8)")
    parser.add_argument("--rotate", type=int, default=50, help="keys to rotate through (50)")
    parser.add_argument("--only", help="comma-separated scenarios (get, verify, list, create)")
    parser.add_argument("--apps", default="A,F,B", help="apps to count, of A, F, B (A,F,B)")
    parser.add_argument("--doc", type=Path, default=DOC, help="the document to write to")
    parser.add_argument("--workdir", type=Path, help="keep the databases, dumps and logs here")
    args = parser.parse_args(argv)
    if args.seconds + TOUCH_SECONDS + 2 * MINUTE_MARGIN >= 60:
        parser.error(f"--seconds: at most {59 - TOUCH_SECONDS - 2 * int(MINUTE_MARGIN)}")
    if set(args.apps.split(",")) - {"A", "F", "B"}:
        parser.error("--apps: choose from A, F and B")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _args(argv)
    stop_servers_on_sigterm()
    labels = [label for label in ("A", "F", "B") if label in args.apps.split(",")]
    chosen = list(scenarios.SCENARIOS)
    if args.only:
        wanted = set(args.only.split(","))
        if wanted - set(scenarios.BY_NAME):
            raise SystemExit(f"bench: --only: choose from {', '.join(scenarios.BY_NAME)}")
        chosen = [s for s in chosen if s.name in wanted]
    started = time.monotonic()
    date = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    revision = report.git_revision(ROOT)
    valgrind = ensure_valgrind()
    settings = wrk.WrkSettings(
        threads=1, connections=args.connections, seconds=args.seconds, timeout_seconds=30
    )
    counts: Counts = {}
    with ExitStack() as stack:
        work = args.workdir or Path(tempfile.mkdtemp(prefix="keysvc-instr-"))
        if args.workdir is None:
            stack.callback(shutil.rmtree, work, ignore_errors=True)
        work.mkdir(parents=True, exist_ok=True)
        folder = work / "keys"
        folder.mkdir()
        seeded = seed.seed(folder / "keysvc.db", 1000, args.rotate)
        with start_keysvc(seeded.db, work / "capture.log") as keysvc:
            shapes_file = scenarios.capture_shapes(keysvc.base, seeded, work / "shapes.json")
        files = {
            s.name: scenarios.write_requests(s, seeded, work / f"{s.name}.tsv") for s in chosen
        }
        for label in labels:
            some = [s for s in chosen if label != "F" or s.name in FLOOR_SCENARIOS]
            if not some:
                continue
            for old in work.glob(f"callgrind.{label}*"):
                old.unlink()  # a dump left in a reused --workdir is never a new one
            callgrind = Callgrind(valgrind, work / f"callgrind.{label}")
            log = work / f"{label}.log"
            if label == "A":
                server = start_baseline(shapes_file, log, callgrind.wrap)
            elif label == "F":
                server = start_floor(shapes_file, log, work / "floor-access.log", callgrind.wrap)
            else:
                server = start_keysvc(seeded.db, log, wrap=callgrind.wrap)
            with server:
                measure_app(label, server, callgrind, files, some, settings, args.warmup, counts)
    facts = [
        *report.head_facts(date, revision, report.command("bench.instructions", argv, " INSTR=1")),
        (
            "load",
            f"`wrk -t1 -c{args.connections}` against 127.0.0.1: {args.warmup}s unrecorded, then"
            f" {args.seconds}s counted per app and scenario; keys rotated: {args.rotate}",
        ),
        ("counter", f"{wrk.version(valgrind, '--version')}, callgrind, every thread of the server"),
        ("run time", f"{time.monotonic() - started:.0f}s"),
    ]
    titles = {
        "A": "A: bare aiohttp baseline, bench/baseline.py",
        "F": "F: the floor, bench/floor.py (read scenarios only)",
        "B": "B: `keysvc serve` on 1,000 seeded keys",
    }
    lines = ["## Instructions per request (callgrind): A, F and B, 1,000 keys", ""]
    lines += [f"- {name}: {value}" for name, value in facts]
    lines += [f"- {titles[label]}" for label in labels]
    lines += ["", table(chosen, labels, counts)]
    text = "\n".join(lines) + "\n"
    print("\n" + text, flush=True)
    report.write_section(args.doc, "instructions", text)
    print(f"bench: wrote {args.doc}", flush=True)
    failed = [
        key
        for key, count in counts.items()
        if count.failures > report.FAILURE_LIMIT * max(count.requests, 1)
    ]
    for name, label in failed:
        print(f"bench: BROKEN: {label} {name}: over 1% of responses failed", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
