"""Run wrk against a loopback URL with bench/rotate.lua, and read its result.

wrk itself comes from Debian's packages and is installed when missing. The
Lua script's done() hook prints one JSON line; nothing is scraped from wrk's
human-readable report.
"""

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

SCRIPT = Path(__file__).with_name("rotate.lua")
_MARK = "BENCH_RESULT "


@dataclass(frozen=True)
class WrkSettings:
    threads: int = 1
    connections: int = 32
    seconds: int = 5
    timeout_seconds: int = 5

    def describe(self) -> str:
        return (
            f"wrk -t{self.threads} -c{self.connections} -d{self.seconds}s"
            f" --timeout {self.timeout_seconds}s -s bench/rotate.lua"
        )


@dataclass(frozen=True)
class Result:
    requests: int
    seconds: float
    bytes: int
    non_2xx: int  # wrk counts statuses above 399; neither app answers 1xx or 3xx
    socket_errors: int  # connect, read and write errors and timeouts
    p50_ms: float
    p99_ms: float

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def bytes_per_response(self) -> float:
        return self.bytes / self.requests if self.requests else 0.0


def ensure_command(command: str, package: str) -> str:
    """The path of ``command``, installed from Debian's ``package`` first if it is missing."""
    found = shutil.which(command)
    if found:
        return found
    print(f"bench: {command} is missing; installing it from Debian's packages", flush=True)
    apt = shutil.which("apt-get")
    if apt is None:
        raise RuntimeError(f"{command} is missing and there is no apt-get to install it with")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run([apt, "update"], check=True, env=env)  # noqa: S603 - fixed arguments
    subprocess.run([apt, "install", "-y", package], check=True, env=env)  # noqa: S603
    found = shutil.which(command)
    if not found:
        raise RuntimeError(f"{command} is still missing after apt-get install {package}")
    return found


def ensure_wrk() -> str:
    """The path of wrk, installed from Debian's packages first if it is missing."""
    return ensure_command("wrk", "wrk")


def version(path: str, flag: str) -> str:
    """The first line a tool prints of its version, less any bracketed tail."""
    done = subprocess.run(  # noqa: S603 - the tool's own path, no shell
        [path, flag], capture_output=True, text=True, check=False
    )
    first = (done.stdout or done.stderr).splitlines()
    return first[0].split(" [")[0] if first else Path(path).name


def run(wrk: str, base_url: str, request_file: Path, settings: WrkSettings) -> Result:
    """One wrk run of ``settings.seconds`` over the requests in ``request_file``."""
    if urlsplit(base_url).hostname != "127.0.0.1":
        raise ValueError(f"wrk may only target 127.0.0.1, not {base_url}")
    command = [
        wrk,
        f"-t{settings.threads}",
        f"-c{settings.connections}",
        f"-d{settings.seconds}s",
        f"--timeout={settings.timeout_seconds}s",
        "-s",
        str(SCRIPT),
        base_url,
        "--",
        str(request_file),
    ]
    done = subprocess.run(  # noqa: S603 - wrk with arguments built here, no shell
        command,
        capture_output=True,
        text=True,
        timeout=settings.seconds + 60,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith(_MARK)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stderr.strip()}")
    data = json.loads(lines[-1].removeprefix(_MARK))
    return Result(
        requests=data["requests"],
        seconds=data["duration_us"] / 1e6,
        bytes=data["bytes"],
        non_2xx=data["status_errors"],
        socket_errors=sum(
            data[name] for name in ("connect_errors", "read_errors", "write_errors", "timeouts")
        ),
        p50_ms=data["p50_us"] / 1000,
        p99_ms=data["p99_us"] / 1000,
    )
