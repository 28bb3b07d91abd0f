"""Import speed (issue 37): ``python -m bench.importing``, ``bench.run --only
importing``, and the end of a default ``make bench`` (about a minute and a half on an
idle 2-core machine).

A JSON Lines file of ``--keys`` records (1,000,000 by default) is generated: each a
key with a 256-bit random bearer token's SHA-256 (``tokenHash``), an importId, a name
and a role. Then:

- ``keysvc import`` stores it into a new SQLite file: keys a second, from the command's
  own summary, against the floor of 20,000;
- the API: a served keysvc (another new SQLite file) takes the first ``--api-keys``
  records in requests of 1,000, one at a time: keys a second over the requests'
  wall time, against the floor of 5,000;
- a sample of the imported tokens (``--sample``) then verifies on each database, as
  ``Authorization: Bearer`` on /v1/verify: every one must answer 200.

The section written to docs/PERFORMANCE.md has the command, the figures and the
machine's load average; the exit code is 1 when a floor is missed or a token fails
(in a default ``make bench``, only when a token fails: a floor is reported, as the
other scenarios' targets are).
"""

import argparse
import base64
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from bench import report, seed
from bench.servers import ROOT, start_keysvc

NAME = "importing"
CLI_FLOOR = 20_000
API_FLOOR = 5_000
PER_REQUEST = 1000


def _args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.importing", description=__doc__)
    parser.add_argument("--keys", type=int, default=1_000_000, help="records in the file")
    parser.add_argument(
        "--api-keys", type=int, default=100_000, help="records sent through the API"
    )
    parser.add_argument("--sample", type=int, default=200, help="tokens verified afterwards")
    parser.add_argument("--doc", type=Path, default=ROOT / "docs" / "PERFORMANCE.md")
    parser.add_argument("--workdir", type=Path, default=None, help="keep the files here")
    return parser.parse_args(argv)


def generate(path: Path, keys: int, sample: int, seed_value: int = 37) -> list[str]:
    """Write ``keys`` records to ``path``; a sample of their tokens, spread over the file."""
    rng = random.Random(seed_value)  # noqa: S311 - reproducible bench data, not secrets
    every = max(1, keys // max(1, sample))
    kept = []
    with path.open("w") as out:
        for n in range(keys):
            token = "sk_live_" + rng.randbytes(32).hex()
            if n % every == 0:
                kept.append(token)
            digest = hashlib.sha256(token.encode()).hexdigest()
            record = {
                "importId": f"bench-{n}",
                "name": f"imported {n}",
                "roles": ["developer"],
                "tokenHash": {"algorithm": "sha256", "encoding": "hex", "value": digest},
            }
            out.write(json.dumps(record, separators=(",", ":")) + "\n")
    return kept


def cli_import(db: Path, org: str, source: Path, keys: int) -> dict[str, float]:
    """``keysvc import`` of ``source``; its summary."""
    env = {**seed.keysvc_env(), "KEYSVC_MAX_KEYS_PER_ORG": str(keys + 10)}
    done = subprocess.run(  # noqa: S603 - keysvc from this interpreter, no shell
        [sys.executable, "-m", "keysvc", "import", "--db", str(db), "--org", org, str(source)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"keysvc import failed: {done.stderr[-2000:]}")
    summary: dict[str, float] = json.loads(done.stdout)
    return summary


def _post(base: str, path: str, body: bytes, headers: dict[str, str]) -> dict[str, object]:
    request = urllib.request.Request(  # noqa: S310 - a loopback http URL
        base + path, data=body, method="POST", headers=headers
    )
    with urllib.request.urlopen(request, timeout=300) as response:  # noqa: S310 - loopback
        answer: dict[str, object] = json.loads(response.read())
    return answer


def api_import(base: str, org: str, admin: seed.Credential, source: Path, keys: int) -> float:
    """The first ``keys`` records of ``source`` through the API, a thousand a request;
    the seconds the requests took."""
    basic = base64.b64encode(f"{admin.key_id}:{admin.secret}".encode()).decode()
    headers = {"Authorization": f"Basic {basic}", "Content-Type": "application/json"}
    path = f"/v1/organizations/{org}/keys/import"
    batches: list[bytes] = []
    with source.open() as lines:
        chunk: list[str] = []
        for n, line in enumerate(lines):
            if n >= keys:
                break
            chunk.append(line.strip())
            if len(chunk) == PER_REQUEST:
                batches.append(('{"keys":[' + ",".join(chunk) + "]}").encode())
                chunk = []
        if chunk:
            batches.append(('{"keys":[' + ",".join(chunk) + "]}").encode())
    started = time.perf_counter()
    for body in batches:
        result = _post(base, path, body, headers)["result"]
        assert isinstance(result, dict) and not result["errors"], result
    return time.perf_counter() - started


def verified(base: str, tokens: Sequence[str]) -> int:
    """How many of ``tokens`` verify (200) as bearer tokens."""
    ok = 0
    for token in tokens:
        request = urllib.request.Request(  # noqa: S310 - a loopback http URL
            base + "/v1/verify", headers={"Authorization": f"Bearer {token}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
                ok += response.status == 200
        except urllib.error.HTTPError:
            pass
    return ok


def run(args: argparse.Namespace, head: Sequence[tuple[str, str]]) -> tuple[str, bool, bool]:
    """The measurements and their section; whether a floor was missed; whether a token
    failed to verify."""
    load = os.getloadavg()[0]
    work = args.workdir or Path(tempfile.mkdtemp(prefix="keysvc-bench-import-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        source = work / "keys.jsonl"
        started = time.perf_counter()
        tokens = generate(source, args.keys, args.sample)
        generated = time.perf_counter() - started
        cli_db, api_db = work / "cli.db", work / "api.db"
        org, _ = seed.bootstrap(cli_db)
        summary = cli_import(cli_db, org, source, args.keys)
        cli_rate = summary["imported"] / summary["seconds"]
        api_org, api_admin = seed.bootstrap(api_db)
        every = max(1, args.keys // max(1, args.sample))
        api_tokens = [t for n, t in enumerate(tokens) if n * every < args.api_keys]
        with start_keysvc(cli_db, work / "cli.log") as server:
            cli_ok = verified(server.base, tokens)
        # The API takes token hashes only where the operator says so (its default, off,
        # refuses them: docs/SECURITY.md, "Imported keys").
        token_import = {"KEYSVC_API_TOKEN_IMPORT": "1"}
        with start_keysvc(api_db, work / "api.log", token_import) as server:
            seconds = api_import(server.base, api_org, api_admin, source, args.api_keys)
            api_ok = verified(server.base, api_tokens)
        api_rate = args.api_keys / seconds
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    missed = cli_rate < CLI_FLOOR or api_rate < API_FLOOR
    failed = cli_ok < len(tokens) or api_ok < len(api_tokens)
    facts = [
        *head,
        ("load", f"the machine's load average was {load:.1f} at the start (1 minute)"),
        ("file", f"{args.keys:,} records, generated in {generated:.0f}s"),
    ]
    rows = [
        "## Import: keysvc import and POST .../keys/import (issue 37)",
        "",
        *(f"- {name}: {value}" for name, value in facts),
        "",
        "| path | keys | seconds | keys/s | floor | tokens verified |",
        "|---|---|---|---|---|---|",
        f"| `keysvc import` into SQLite | {summary['imported']:,.0f} | {summary['seconds']:.1f}"
        f" | {cli_rate:,.0f} | {CLI_FLOOR:,} | {cli_ok}/{len(tokens)} |",
        f"| API, {PER_REQUEST:,} a request, SQLite | {args.api_keys:,} | {seconds:.1f}"
        f" | {api_rate:,.0f} | {API_FLOOR:,} | {api_ok}/{len(api_tokens)} |",
    ]
    return "\n".join(rows), missed, failed


def main(argv: Sequence[str] | None = None, floors: bool = True) -> int:
    """1 when a token failed to verify, or (``floors``) a floor was missed."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _args(argv)
    date = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    head = report.head_facts(
        date, report.git_revision(ROOT), report.command("bench.importing", argv)
    )
    text, missed, failed = run(args, head)
    print(text, flush=True)
    report.write_section(args.doc, NAME, text)
    return 1 if failed or (floors and missed) else 0


if __name__ == "__main__":
    sys.exit(main())
