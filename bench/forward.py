"""The forward-auth scenario (``--only forward-auth``): a real nginx in front of a static
file, four ways, measured by wrk through nginx in one run, with the ratios to nginx's own
``auth_basic``:

- basic: ``auth_basic`` with an htpasswd file of ``{SHA}`` entries;
- static: no auth;
- verify: ``auth_request`` to keysvc with the shipped docs/nginx-auth-request.conf,
  keysvc run with ``KEYSVC_VERIFY_REUSE_SECONDS=0`` (every request reaches keysvc);
- reuse: the same with the default, 1 s (nginx reuses keysvc's answers within it).

Each setup is its own nginx (one worker) proxying to one more nginx that serves the
file, so every setup has the same proxy hop and processes. The auth_request fronts keep
keysvc's answers on tmpfs (/dev/shm), as the shipped config's ``{keysvc_cache}`` says.
The requests rotate through ``--forward-keys`` seeded keys; the htpasswd file holds the
same key IDs and secrets, so one request file serves all four. Each round also prints
what a request cost each front's nginx worker in CPU time (from /proc), a figure the
machine's other load moves less than requests/s. Then hey, at one paced rate (half the
lower peak of basic and reuse), sends one key's requests through basic and reuse in
turn, and their p99 are compared. The section is ``forward`` in docs/PERFORMANCE.md.

``KEYSVC_BENCH_NGINX_CONF`` names another config template to run in place of the shipped
one (a scratch copy with some lines removed, to measure what they cost); the report then
names it.
"""

import base64
import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path

from bench import hey, report, scenarios, seed, wrk
from bench.report import Cell, CellGrid, Column
from bench.servers import ROOT, Server, StopsOnExit, free_port, start_keysvc

NAME = "forward-auth"
SHIPPED = ROOT / "docs" / "nginx-auth-request.conf"
# Another template in place of the shipped one, for an ablation (docs/PERFORMANCE.md).
TEMPLATE = Path(os.environ.get("KEYSVC_BENCH_NGINX_CONF") or SHIPPED)
# The modules the shipped config needs (Debian's libnginx-mod-http-set-misc, and the NDK
# module it depends on), loaded as Debian's modules-enabled does; make system-deps
# installs them.
MODULES = (
    "/usr/lib/nginx/modules/ndk_http_module.so",
    "/usr/lib/nginx/modules/ngx_http_set_misc_module.so",
)
PATH = "/file.txt"
BODY = "a static file behind the proxy hop\n"
TARGET = 0.70  # reuse's requests/s over auth_basic's, at least
PACED_SHARE = 0.5  # of the lower peak of basic and reuse
DEFAULT_KEYS = 100
_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")
# Where the auth_request fronts keep keysvc's answers: tmpfs, as the shipped config asks
# (on ext4, each kept answer's new file cost nginx's worker up to 0.5 ms:
# docs/PERFORMANCE.md); the work folder where there is none.
TMPFS = Path("/dev/shm")  # noqa: S108 - a private folder is made in it (mkdtemp)
# The table's columns, auth_basic first: every ratio is to it.
BASIC = Column("basic", "nginx `auth_basic`, an htpasswd file of `{SHA}` entries", False)
STATIC = Column("static", "nginx, no auth", False)
VERIFY = Column(
    "verify",
    "nginx `auth_request` to keysvc, the shipped config, `KEYSVC_VERIFY_REUSE_SECONDS=0`",
    True,
)
REUSE = Column("reuse", "the same, reuse 1 s (the default): nginx keeps keysvc's answers", True)
COLUMNS = (BASIC, STATIC, VERIFY, REUSE)


def render(values: dict[str, str]) -> str:
    """The shipped config with its placeholders filled in; none may be left over."""
    text = TEMPLATE.read_text()
    unknown = set(_PLACEHOLDER.findall(text)) - set(values)
    if unknown:
        raise RuntimeError(f"{TEMPLATE.name} has placeholders the bench does not fill: {unknown}")
    return _PLACEHOLDER.sub(lambda match: values[match[1]], text)


def htpasswd(credentials: Sequence[seed.Credential]) -> str:
    """An htpasswd file: each key ID with its secret's ``{SHA}`` (base64 of SHA-1)."""
    return "".join(
        f"{c.key_id}:{{SHA}}{base64.b64encode(hashlib.sha1(c.secret.encode()).digest()).decode()}\n"  # noqa: S324 - the format nginx reads
        for c in credentials
    )


class Nginx(StopsOnExit):
    """nginx in the foreground, in its own session, with one worker and ``block`` (server
    blocks and what goes beside them) in its http context, on ``port``."""

    def __init__(self, binary: str, folder: Path, port: int, block: str):
        folder.mkdir(parents=True)
        self.port, self.base = port, f"http://127.0.0.1:{port}"
        temp = "".join(
            f"    {kind}_temp_path {folder / kind};\n"
            for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
        )
        conf = folder / "nginx.conf"
        conf.write_text(
            "".join(f"load_module {module};\n" for module in MODULES)
            + ("user root;\n" if os.geteuid() == 0 else "")
            + "worker_processes 1;\nevents {\n    worker_connections 4096;\n}\n"
            + f"http {{\n    access_log off;\n{temp}{block}\n}}\n"
        )
        self.log = folder / "error.log"
        command = [binary, "-p", f"{folder}/", "-c", str(conf), "-e", str(self.log)]
        command += ["-g", f"daemon off; pid {folder / 'nginx.pid'};"]
        with (folder / "nginx.out").open("wb") as out:
            self.proc = subprocess.Popen(  # noqa: S603 - nginx with arguments built here
                command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nginx exited: {self.log.read_text(errors='replace')}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"nginx did not start on {port}")

    def worker_cpu_seconds(self) -> float:
        """CPU time (user and system) its one worker has used so far: what a request
        costs nginx itself, whatever else the machine runs."""
        master = self.proc.pid
        worker = Path(f"/proc/{master}/task/{master}/children").read_text().split()[0]
        fields = Path(f"/proc/{worker}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _front(port: int, upstream: str, auth: str = "") -> str:
    return (
        f"server {{\n    listen 127.0.0.1:{port};\n    location / {{\n{auth}"
        f"        proxy_pass {upstream}/;\n    }}\n}}"
    )


@dataclass(frozen=True)
class Stack:
    """The four fronts by column label, the keysvc behind each auth_request one, and
    the key whose requests hey sends."""

    fronts: dict[str, Nginx]
    keysvc: dict[str, Server]
    requests: Path
    one: scenarios.Line


def start(stack: ExitStack, work: Path, keys: int, loop: str) -> Stack:
    """The file server, the four fronts and two keysvc, all in ``work``."""
    binary = wrk.ensure_command("nginx", "nginx")
    seeded = seed.seed(work / "keysvc.db", keys, rotate=keys)
    files = work / "files"
    files.mkdir()
    (files / PATH.lstrip("/")).write_text(BODY)
    (work / "htpasswd").write_text(htpasswd(seeded.sample))
    static_port = free_port()
    served = f"server {{\n    listen 127.0.0.1:{static_port};\n    root {files};\n}}"
    stack.enter_context(Nginx(binary, work / "nginx-files", static_port, served))
    upstream = f"http://127.0.0.1:{static_port}"
    basic_auth = f'        auth_basic "bench";\n        auth_basic_user_file {work / "htpasswd"};\n'
    started: dict[str, Nginx] = {}
    servers: dict[str, Server] = {}
    caches = work
    if TMPFS.is_dir():
        caches = Path(tempfile.mkdtemp(prefix="keysvc-bench-", dir=TMPFS))
        stack.callback(shutil.rmtree, caches, True)
    for column, reuse, auth in (
        (BASIC, None, basic_auth),
        (STATIC, None, ""),
        (VERIFY, "0", ""),
        (REUSE, "1", ""),
    ):
        label, port = column.label, free_port()
        block = _front(port, upstream, auth)
        if reuse is not None:
            sock = work / f"keysvc-{label}.sock"
            env = {"KEYSVC_UNIX": str(sock), "KEYSVC_VERIFY_REUSE_SECONDS": reuse}
            env |= {"KEYSVC_LOOP": loop, "KEYSVC_TRUSTED_PROXIES": ""}
            log = work / f"keysvc-{label}.log"
            servers[label] = stack.enter_context(start_keysvc(seeded.db, log, env, label))
            block = render(
                {
                    "listen_port": str(port),
                    "keysvc_socket": str(sock),
                    "upstream": upstream,
                    "organization_id": seeded.organization_id,
                    "keysvc_cache": str(caches / f"cache-{label}"),
                }
            )
        started[label] = stack.enter_context(Nginx(binary, work / f"nginx-{label}", port, block))
    lines = [scenarios.Line("GET", PATH, scenarios.basic(c)) for c in seeded.sample]
    requests = work / "forward.tsv"
    requests.write_text("".join(line.tsv() for line in lines))
    return Stack(started, servers, requests, lines[0])


def measure(
    plan_wrk: str,
    hey_path: str,
    settings: wrk.WrkSettings,
    rounds: int,
    warmup: int,
    paced_workers: int,
    stack: Stack,
) -> tuple[CellGrid, float]:
    """wrk flat out through each front in turn, round by round; then hey through basic
    and reuse at one rate. The grid (``NAME`` and ``NAME-paced``) and that rate."""
    flat = {c.label: Cell() for c in COLUMNS}
    print(f"bench: {NAME}: nginx in front of a static file, four ways", flush=True)
    for column in COLUMNS:
        front = stack.fronts[column.label]
        flat[column.label].probe_status = scenarios.probe(front.base, stack.one).status
        if warmup:
            wrk.run(plan_wrk, front.base, stack.requests, replace(settings, seconds=warmup))
    for number in range(1, rounds + 1):
        seen = []
        for column in COLUMNS:
            front = stack.fronts[column.label]
            used = front.worker_cpu_seconds()
            result = wrk.run(plan_wrk, front.base, stack.requests, settings)
            used = front.worker_cpu_seconds() - used
            flat[column.label].rounds.append(result)
            per_request = 1e6 * used / result.requests if result.requests else 0.0
            seen.append(f"{column.label} {result.rps:,.0f} req/s ({per_request:.0f} us CPU)")
        for server in stack.keysvc.values():
            server.check_alive()
        print(f"bench:   round {number}/{rounds}: {', '.join(seen)}", flush=True)
    for label, server in stack.keysvc.items():
        flat[label].rss_kib = server.rss_kib()
    peak = min(flat[c.label].median(lambda r: r.rps) for c in (BASIC, REUSE))
    paced = hey.PacedSettings(PACED_SHARE * peak, paced_workers, settings.seconds)
    print(f"bench:   paced: {paced.rate:,.0f} req/s through basic and reuse", flush=True)
    slow = {c.label: Cell(paced_rate=paced.rate) for c in (BASIC, REUSE)}
    for number in range(1, rounds + 1):
        seen = []
        for column in (BASIC, REUSE):
            base = stack.fronts[column.label].base
            if warmup and number == 1:
                hey.run(hey_path, base, stack.one, replace(paced, seconds=warmup))
            result = hey.run(hey_path, base, stack.one, paced)
            slow[column.label].rounds.append(result)
            seen.append(f"{column.label} p99 {result.p99_ms:.2f} ms")
        print(f"bench:   paced round {number}/{rounds}: {', '.join(seen)}", flush=True)
    return {NAME: flat, f"{NAME}-paced": slow}, paced.rate


def _paced_table(grid: CellGrid, rate: float) -> str:
    cells = grid[f"{NAME}-paced"]
    basic, reuse = cells[BASIC.label], cells[REUSE.label]
    ratio = reuse.median(lambda r: r.p99_ms) / (basic.median(lambda r: r.p99_ms) or 1.0)
    rows = [
        "| paced rate | basic req/s | reuse req/s | basic p50 / p99 ms | reuse p50 / p99 ms"
        " | reuse/basic p99 | failed |",
        "|---|---|---|---|---|---|---|",
    ]
    pair = [
        f"{cell.median(lambda r: r.p50_ms):.2f} / {cell.median(lambda r: r.p99_ms):.2f}"
        for cell in (basic, reuse)
    ]
    rows.append(
        f"| {rate:,.0f} req/s | {basic.median(lambda r: r.rps):,.0f}"
        f" | {reuse.median(lambda r: r.rps):,.0f} | {pair[0]} | {pair[1]} | {ratio:.2f}"
        f" | {basic.failures + reuse.failures:,} |"
    )
    return "\n".join(rows)


def section(
    grid: CellGrid,
    rate: float,
    facts: list[tuple[str, str]],
    keys: int,
) -> str:
    """The ``forward`` section of docs/PERFORMANCE.md."""
    flat = grid[NAME]
    basic = flat[BASIC.label].median(lambda r: r.rps)
    reuse = flat[REUSE.label].median(lambda r: r.rps)
    ratio = reuse / basic if basic else 0.0
    met = "met" if ratio >= TARGET else "MISSED"
    lines = ["## Forward auth: nginx auth_basic vs auth_request to keysvc", ""]
    lines += [f"- {name}: {value}" for name, value in facts]
    if TEMPLATE != SHIPPED:
        lines += [f"- nginx config: {TEMPLATE} (KEYSVC_BENCH_NGINX_CONF), not the shipped one"]
    lines += [
        f"- target: with reuse, at least {TARGET:.2f} of `auth_basic`'s requests/s:"
        f" reuse/basic {ratio:.2f}, {met}",
        f"- requests: `GET {PATH}` ({len(BODY)} bytes, served by one more nginx behind"
        f" each front), rotating through {keys} seeded keys' Basic credentials; the"
        " htpasswd file holds the same key IDs and secrets",
        f"- cache: keysvc's answers kept by nginx in {TMPFS} (tmpfs), as the shipped"
        " config asks, where the machine has it",
        "- hey: one key's requests through basic and reuse in turn, at half the lower of"
        " their medians above; p50 and p99 to 0.1 ms",
    ]
    lines += [f"- {c.label}: {c.title}" for c in COLUMNS]
    names = [(NAME, "GET a static file through nginx")]
    lines += ["", report.table(names, COLUMNS, grid), "", _paced_table(grid, rate)]
    lines += ["", "Every round:", "", report.rounds_table(names, COLUMNS, grid)]
    return "\n".join(lines) + "\n"
