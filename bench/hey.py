"""Run hey at a fixed rate against a loopback URL, and read its summary.

wrk keeps every connection busy, so its latencies are those of a saturated
server. The paced scenario asks instead what a request waits at half the peak
rate: hey (Debian's package, installed when missing) with ``-q``, which paces
each of its ``-c`` workers to that many requests a second, so the total rate
is q times c. hey sends one request over and over (one key's credentials); it
reports latencies to a tenth of a millisecond.

hey's workers start together and tick together, so requests arrive in bursts
of c, and a worker waits for its answer before its next tick: a server slower
than c over the rate per request falls short of the rate, which shows as
achieved requests/s below the rate asked. Both apps meet the same bursts.
"""

import re
import shutil
import subprocess
from dataclasses import dataclass
from urllib.parse import urlsplit

from bench.scenarios import Line
from bench.wrk import Result, ensure_command

_PERCENTILE = re.compile(r"^\s*(\d+)%+ in ([\d.]+) secs$", re.MULTILINE)
_STATUS = re.compile(r"^\s*\[(\d+)\]\s+(\d+) responses$", re.MULTILINE)
_TOTAL = re.compile(r"^\s*Total:\s+([\d.]+) secs$", re.MULTILINE)


@dataclass(frozen=True)
class PacedSettings:
    rate: float  # requests a second, all workers together
    workers: int = 16
    seconds: int = 5
    timeout_seconds: int = 5

    @property
    def per_worker(self) -> float:
        return self.rate / self.workers

    def describe(self) -> str:
        workers, seconds = self.workers, self.seconds
        return f"hey -c{workers} -q RATE/{workers} -z{seconds}s -t{self.timeout_seconds}"


def ensure_hey() -> str:
    """The path of hey, installed from Debian's packages first if it is missing."""
    return ensure_command("hey", "hey")


def version() -> str:
    """hey has no version flag: its Debian package's version, as wrk names its own."""
    dpkg = shutil.which("dpkg-query")
    if dpkg is None:
        return "hey"
    done = subprocess.run(  # noqa: S603 - a fixed query, no shell
        [dpkg, "-W", "-f", "${Version}", "hey"], capture_output=True, text=True, check=False
    )
    return f"hey debian/{done.stdout.strip()}" if done.returncode == 0 else "hey"


def command(hey: str, base_url: str, line: Line, settings: PacedSettings) -> list[str]:
    """hey's arguments for ``line`` at ``settings.rate`` in all."""
    if urlsplit(base_url).hostname != "127.0.0.1":
        raise ValueError(f"hey may only target 127.0.0.1, not {base_url}")
    if line.body:
        raise ValueError("a paced scenario sends no body")
    return [
        hey,
        "-c",
        str(settings.workers),
        "-q",
        f"{settings.per_worker:.3f}",
        "-z",
        f"{settings.seconds}s",
        "-t",
        str(settings.timeout_seconds),
        "-m",
        line.method,
        "-H",
        f"Authorization: {line.authorization}",
        "-disable-compression",
        base_url + line.path,
    ]


def parse(summary: str) -> Result:
    """hey's text summary as a Result. Bytes are not counted: hey counts body bytes
    only, where wrk counts whole responses, so the two would not compare."""
    total = _TOTAL.search(summary)
    percentiles = {int(p): float(secs) * 1000 for p, secs in _PERCENTILE.findall(summary)}
    statuses = {int(code): int(count) for code, count in _STATUS.findall(summary)}
    errors = 0
    if "Error distribution:" in summary:
        tail = summary.split("Error distribution:", 1)[1]
        errors = sum(int(count) for count in re.findall(r"^\s*\[(\d+)\]", tail, re.MULTILINE))
    if total is None or 50 not in percentiles or 99 not in percentiles:
        raise RuntimeError(f"hey's summary has no total or percentiles:\n{summary}")
    return Result(
        requests=sum(statuses.values()),
        seconds=float(total[1]),
        bytes=0,
        non_2xx=sum(count for code, count in statuses.items() if not 200 <= code < 300),
        socket_errors=errors,
        p50_ms=percentiles[50],
        p99_ms=percentiles[99],
    )


def run(hey: str, base_url: str, line: Line, settings: PacedSettings) -> Result:
    """One hey run of ``settings.seconds`` sending ``line`` at ``settings.rate``."""
    done = subprocess.run(  # noqa: S603 - hey with arguments built here, no shell
        command(hey, base_url, line, settings),
        capture_output=True,
        text=True,
        timeout=settings.seconds + 60,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"hey failed ({done.returncode}): {done.stderr.strip()}")
    return parse(done.stdout)
