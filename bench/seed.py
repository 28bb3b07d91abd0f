"""Seed a keysvc database for the benchmark, fast, without HTTP: with keysvc's import.

``keysvc bootstrap`` creates the database, its schema, pepper, organization and
admin key; ``keysvc import`` (issue 37) then stores the benchmark keys, from JSON
Lines records the seed writes to its standard input: each key's ID and secret as
``hashData`` (their SHA-256s, which the import hashes with the pepper as a create
does), the developer role and, for some of them, credits, a named limit or an
externalId. So the bench's databases are made as a team moving in would make
theirs, on SQLite and on PostgreSQL alike, and the import is run at the bench's
sizes every time the bench runs. The keys' UUIDs are the import's own, read back
from ``key_imports`` by importId. The credentials of a random sample of the keys
(all of them up to ``--rotate``) are written to ``keys.tsv``
(``uuid<TAB>keyId<TAB>secret``) and the organization and admin key to ``seed.json``,
for the wrk scripts.

``--others N`` adds N more keys that never authenticate: the admin reads them
(bench/scenarios.py, "get-other"). Their ``usedAt`` is set to this minute, as
using the others once before measuring sets theirs, so that every key's JSON
has the same size. An import cannot say that, nor the identities' shared credits
(an import makes a key's identity bare, as a create does): both are set by SQL
once the import is done, in one transaction.

Credentials come from a seeded ``random.Random``, not ``secrets``: they are
throwaway benchmark data, and a million of them must take seconds, not minutes.
"""

import argparse
import asyncio
import contextlib
import json
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from keysvc.credentials import (
    BASE62,
    KEY_ID_LENGTH,
    SECRET_PREFIX,
    SECRET_RANDOM_LENGTH,
    SUFFIX_LENGTH,
    checksum,
    sha256_b64,
)
from keysvc.db.postgres.connection import connect_postgres
from keysvc.timeutil import to_minute, to_text, utcnow

DEVELOPER_ROLE = "0b5d3c8e-6c1a-4c59-9d8a-7a1f0e000002"
# Records a transaction of the seed's import: the CLI's largest, on either backend.
# Nothing serves the database while it is seeded, so no other writer waits for a batch.
IMPORT_BATCH = 20_000
# Issue 29: the keys of the verify-credits scenario, with more credits than any run spends.
CREDITS = 10**12
# Issue 36: the keys of the verify-limited scenario, with one autoApply named limit
# that no run reaches.
LIMITS = [{"name": "requests", "limit": 10**9, "windowSeconds": 60, "autoApply": True}]
# Issue 36: the keys of the verify-identity scenario belong, KEYS_PER_IDENTITY to a
# customer, to identities with shared credits that no run spends; those of
# verify-identity-both have credits of their own as well, so a verify spends from both.
KEYS_PER_IDENTITY = 4
_IMPORTED = "select import_id, key_id from key_imports where organization_id = ?"
_USED = "update api_keys set used_at = ? where id = ?"
_IDENTITY_CREDITS = (
    "update identities set credits_remaining = ?, credits_base = ? where organization_id = ?"
)


@dataclass(frozen=True)
class Credential:
    id: str  # the key's UUID, used in paths
    key_id: str  # the Basic-auth user name
    secret: str


@dataclass(frozen=True)
class Seeded:
    db: str  # what keysvc serve --db names: a file, or a PostgreSQL URL
    organization_id: str
    admin: Credential
    keys: int  # seeded keys, the admin key and the others not counted
    sample: list[Credential]  # the keys the benchmark rotates through
    others: list[str]  # UUIDs of the keys that never authenticate, only read
    credited: list[Credential] = field(default_factory=list)  # keys with credits, not sampled
    limited: list[Credential] = field(default_factory=list)  # keys with a named limit, likewise
    # Keys of identities with credits (issue 36), likewise; the second: with their own too.
    identified: list[Credential] = field(default_factory=list)
    both: list[Credential] = field(default_factory=list)


def keysvc_env() -> dict[str, str]:
    """The environment without KEYSVC_* settings, so only what the bench sets applies."""
    return {name: value for name, value in os.environ.items() if not name.startswith("KEYSVC_")}


def bootstrap(db: Path | str, settings: dict[str, str] | None = None) -> tuple[str, Credential]:
    """``keysvc bootstrap`` of ``db`` (a file or a PostgreSQL URL), with ``settings``
    (KEYSVC_* variables) on top of the bench's environment."""
    done = subprocess.run(  # noqa: S603 - keysvc from this interpreter, no shell
        [sys.executable, "-m", "keysvc", "bootstrap", "--db", str(db), "--org-name", "bench"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**keysvc_env(), **(settings or {})},
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"keysvc bootstrap failed: {done.stderr.strip()}")
    made = json.loads(done.stdout)
    return made["organizationId"], Credential(made["id"], made["keyId"], made["keySecret"])


def _credentials(rng: random.Random, count: int) -> Iterator[Credential]:
    """``count`` key IDs and secrets; their UUIDs ("") are the import's to make."""
    for _ in range(count):
        chars = "".join(rng.choices(BASE62, k=KEY_ID_LENGTH + SECRET_RANDOM_LENGTH))
        body = chars[KEY_ID_LENGTH:]
        yield Credential("", chars[:KEY_ID_LENGTH], SECRET_PREFIX + body + checksum(body))


def _name(index: int) -> str:
    """The key's name and importId: one width, so that every answer has one size."""
    return f"bench-{index:07d}"


@dataclass
class _Rows:
    """The import records of ``keys`` developer keys and ``others`` more; the keys
    the bench keeps fill ``kept`` as the records are taken, by their place."""

    keys: int
    rotate: int
    others: int
    seed_value: int
    kept: dict[int, Credential] = field(default_factory=dict)
    sample: list[int] = field(default_factory=list)
    credited: list[int] = field(default_factory=list)
    limited: list[int] = field(default_factory=list)
    identified: list[int] = field(default_factory=list)
    both: list[int] = field(default_factory=list)

    def _external_id(self, place: int) -> str:
        return f"bench-customer-{place // KEYS_PER_IDENTITY:05d}"

    def records(self) -> Iterator[str]:
        """The JSON Lines the import reads, a line at a time."""
        rng = random.Random(self.seed_value)  # noqa: S311 - benchmark data, see the module
        chosen = set(rng.sample(range(self.keys), min(self.rotate, self.keys)))
        # Keys with credits (issue 29's verify-credits): the last of the others, up to
        # half of them and as many as the sample; no key more is made, and none sampled.
        first_credited = self.keys + self.others - min(self.rotate, self.others // 2)
        # Keys with a named limit (issue 36's verify-limited): as many others just before.
        first_limited = first_credited - min(self.rotate, (first_credited - self.keys) // 2)
        # Keys of identities (issue 36's verify-identity, then verify-identity-both): as
        # many more again for each, just before; whole identities of KEYS_PER_IDENTITY.
        span = min(self.rotate, (first_limited - self.keys) // 3)
        span -= span % KEYS_PER_IDENTITY
        first_both = first_limited - span
        first_identified = first_both - span
        for index, cred in enumerate(_credentials(rng, self.keys + self.others)):
            name = _name(index)
            record: dict[str, object] = {
                "importId": name,
                "name": name,
                "roles": ["developer"],
                "hashData": {
                    "keyIdHash": sha256_b64(cred.key_id),
                    "keyIdSuffix": cred.key_id[-SUFFIX_LENGTH:],
                    "keySecretHash": sha256_b64(cred.secret),
                },
            }
            if index in chosen:
                self.sample.append(index)
            if index >= first_credited:
                self.credited.append(index)
                record["credits"] = {"remaining": CREDITS}
            elif index >= first_limited:
                self.limited.append(index)
                record["ratelimits"] = LIMITS
            elif index >= first_both:
                self.both.append(index)
                record["externalId"] = self._external_id(index - first_identified)
                record["credits"] = {"remaining": CREDITS}
            elif index >= first_identified:
                self.identified.append(index)
                record["externalId"] = self._external_id(index - first_identified)
            if index in chosen or index >= first_identified:
                self.kept[index] = cred
            yield json.dumps(record, separators=(",", ":")) + "\n"

    def seeded(
        self, db: str, organization_id: str, admin: Credential, ids: Mapping[int, str]
    ) -> Seeded:
        """What was seeded, the keys' UUIDs ``ids`` (by place) as the import made them."""

        def creds(places: list[int]) -> list[Credential]:
            return [
                Credential(ids[place], self.kept[place].key_id, self.kept[place].secret)
                for place in places
            ]

        return Seeded(
            db,
            organization_id,
            admin,
            self.keys,
            creds(self.sample),
            [ids[place] for place in range(self.keys, self.keys + self.others)],
            creds(self.credited),
            creds(self.limited),
            creds(self.identified),
            creds(self.both),
        )


def _import(db: str, organization_id: str, rows: _Rows, settings: dict[str, str]) -> None:
    """``keysvc import`` of ``rows``' records, fed on its standard input; every one
    must go in."""
    command = [
        sys.executable, "-m", "keysvc", "import", "--db", db, "--org", organization_id,
        "--max-keys-per-org", str(rows.keys + rows.others + 1),
        "--batch", str(IMPORT_BATCH), "-",
    ]  # fmt: skip
    # Its output goes to files: a pipe it filled while the seed writes would stop both.
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as errors:
        importing = subprocess.Popen(  # noqa: S603 - keysvc from this interpreter, no shell
            command,
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=errors,
            text=True,
            env={**keysvc_env(), **settings},
        )
        assert importing.stdin is not None
        # A BrokenPipeError: it stopped early, and its return code and errors say why.
        with contextlib.suppress(BrokenPipeError):
            importing.stdin.writelines(rows.records())
        with contextlib.suppress(BrokenPipeError):
            importing.stdin.close()
        code = importing.wait()
        out.seek(0)
        errors.seek(0)
        summary, why = out.read(), errors.read()
    try:
        imported = json.loads(summary)["imported"]
    except (ValueError, KeyError, TypeError):
        imported = None  # no summary: its errors say why
    if code != 0 or imported != rows.keys + rows.others:
        raise RuntimeError(f"keysvc import failed ({code}): {summary} {why[-2000:]}")


def _places(imported: list[tuple[str, str]]) -> dict[int, str]:
    """Each key's UUID by its place, from key_imports' (importId, UUID) rows."""
    return {int(import_id.removeprefix("bench-")): key_id for import_id, key_id in imported}


def seed(db: Path, keys: int, rotate: int = 1000, seed_value: int = 1, others: int = 0) -> Seeded:
    """Create ``db`` (which must not exist) with an admin key, ``keys`` developer keys
    and ``others`` more that only the admin reads."""
    if db.exists():
        raise FileExistsError(f"{db} exists; seed a fresh path")
    organization_id, admin = bootstrap(db)
    rows = _Rows(keys, rotate, others, seed_value)
    # The pepper is the one keysvc serve will read: <db>.pepper (no KEYSVC_PEPPER is passed).
    _import(str(db), organization_id, rows, {})
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        ids = _places(conn.execute(_IMPORTED, (organization_id,)).fetchall())
        seeded = rows.seeded(str(db), organization_id, admin, ids)
        conn.execute("begin immediate")
        used_at = to_text(to_minute(utcnow()))
        conn.executemany(_USED, [(used_at, uuid) for uuid in seeded.others])
        conn.execute(_IDENTITY_CREDITS, (CREDITS, CREDITS, organization_id))
        conn.execute("commit")
        conn.execute("pragma wal_checkpoint(truncate)")
    finally:
        conn.close()
    return seeded


def seed_postgres(
    url: str, pepper: str, keys: int, rotate: int = 1000, seed_value: int = 1, others: int = 0
) -> Seeded:
    """``seed`` on the empty PostgreSQL database at ``url``, whose instances run with
    KEYSVC_PEPPER ``pepper``: the same keys (the same ``seed_value``: the same key IDs
    and secrets; the UUIDs are each import's own), bootstrapped and imported by keysvc."""
    settings = {"KEYSVC_PEPPER": pepper}
    organization_id, admin = bootstrap(url, settings)
    rows = _Rows(keys, rotate, others, seed_value)
    _import(url, organization_id, rows, settings)
    return asyncio.run(_patch_postgres(url, organization_id, admin, rows))


async def _patch_postgres(url: str, organization_id: str, admin: Credential, rows: _Rows) -> Seeded:
    conn = await connect_postgres(url)
    try:
        ids = _places(await conn.execute_fetchall(_IMPORTED, (organization_id,)))
        seeded = rows.seeded(url, organization_id, admin, ids)
        used_at = to_text(to_minute(utcnow()))
        async with conn.raw.transaction():
            await conn.executemany(_USED, [(used_at, uuid) for uuid in seeded.others])
            await conn.execute(_IDENTITY_CREDITS, (CREDITS, CREDITS, organization_id))
    finally:
        await conn.close()
    return seeded


def write(seeded: Seeded, out: Path) -> None:
    """``keys.tsv`` (the sample) and ``seed.json`` (organization and admin) in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    lines = (f"{c.id}\t{c.key_id}\t{c.secret}\n" for c in seeded.sample)
    (out / "keys.tsv").write_text("".join(lines))
    about = {
        "db": seeded.db,
        "organizationId": seeded.organization_id,
        "admin": asdict(seeded.admin),
        "keys": seeded.keys,
        "others": len(seeded.others),
    }
    (out / "seed.json").write_text(json.dumps(about, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description="Seed a keysvc database for the benchmark.")
    parser.add_argument("--db", type=Path, required=True, help="database file to create")
    parser.add_argument("--keys", type=int, default=1000, help="developer keys to seed")
    parser.add_argument("--rotate", type=int, default=1000, help="credentials to write out")
    parser.add_argument("--others", type=int, default=0, help="more keys, never authenticating")
    parser.add_argument("--out", type=Path, help="folder for keys.tsv and seed.json")
    args = parser.parse_args()
    started = time.monotonic()
    seeded = seed(args.db, args.keys, args.rotate, others=args.others)
    write(seeded, args.out or args.db.parent)
    print(f"seeded {seeded.keys} keys into {args.db} in {time.monotonic() - started:.1f}s")


if __name__ == "__main__":
    main()
