"""Seed a keysvc database for the benchmark, fast, without HTTP.

``keysvc bootstrap`` creates the database, its schema, pepper, organization and
admin key through keysvc's own code; the benchmark keys are then inserted with
sqlite3 in one transaction (``seed_postgres``: on PostgreSQL, the same keys
through keysvc's own connection, ``keysvc.db.postgres.connection``), hashed with keysvc's
own ``Hasher``, each holding the developer system role. The credentials of a
random sample of them (all of them up to ``--rotate``) are written to ``keys.tsv``
(``uuid<TAB>keyId<TAB>secret``) and the organization and admin key to ``seed.json``,
for the wrk scripts.

``--others N`` adds N more keys that never authenticate: the admin reads them
(bench/scenarios.py, "get-other"). Their ``usedAt`` is set to this minute, as
using the others once before measuring sets theirs, so that every key's JSON
has the same size.

Credentials come from a seeded ``random.Random``, not ``secrets``: they are
throwaway benchmark data, and a million of them must take seconds, not minutes.
"""

import argparse
import asyncio
import json
import os
import random
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from keysvc.credentials import (
    BASE62,
    KEY_ID_LENGTH,
    SECRET_PREFIX,
    SECRET_RANDOM_LENGTH,
    SUFFIX_LENGTH,
    Hasher,
    checksum,
    load_pepper,
    sha256_b64,
)
from keysvc.db.postgres.connection import connect_postgres
from keysvc.timeutil import to_minute, to_text, utcnow

DEVELOPER_ROLE = "0b5d3c8e-6c1a-4c59-9d8a-7a1f0e000002"
BATCH = 20_000
# org_seq: each key's place in the organization, after the admin key's 1.
_INSERT_KEY = """
    insert into api_keys (id, organization_id, name, state, key_id_hash, secret_hash,
                          key_suffix, created_at, used_at, org_seq)
    values (?, ?, ?, 'enabled', ?, ?, ?, ?, ?, ?)
"""
_INSERT_ROLE = "insert into key_roles (key_id, role_id) values (?, ?)"
# Issue 29: the keys of the verify-credits scenario, with more credits than any run spends.
_INSERT_CREDITS = (
    "insert into key_details (key_id, credits_remaining, credits_base) values (?, ?, ?)"
)
CREDITS = 10**12
# Issue 36: the keys of the verify-limited scenario, with one autoApply named limit
# that no run reaches.
_INSERT_LIMITS = "insert into key_details (key_id, ratelimits) values (?, ?)"
LIMITS = json.dumps(
    [{"name": "requests", "limit": 10**9, "windowSeconds": 60, "autoApply": True}],
    separators=(",", ":"),
)
# Issue 36: the keys of the verify-identity scenario belong, KEYS_PER_IDENTITY to a
# customer, to identities with shared credits that no run spends; those of
# verify-identity-both have credits of their own as well, so a verify spends from both.
KEYS_PER_IDENTITY = 4
_INSERT_IDENTITY = """
    insert into identities (id, organization_id, org_seq, external_id, credits_remaining,
                            credits_base, created_at, updated_at)
    values (?, ?, ?, ?, ?, ?, ?, ?)
"""
_INSERT_MEMBER = """
    insert into key_details (key_id, external_id, credits_remaining, credits_base)
    values (?, ?, ?, ?)
"""


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
    for _ in range(count):
        chars = "".join(rng.choices(BASE62, k=KEY_ID_LENGTH + SECRET_RANDOM_LENGTH))
        body = chars[KEY_ID_LENGTH:]
        yield Credential(
            str(uuid.UUID(int=rng.getrandbits(128), version=4)),
            chars[:KEY_ID_LENGTH],
            SECRET_PREFIX + body + checksum(body),
        )


KeyRow = tuple[str, str, str, bytes, bytes, str, str, str | None, int]
RoleRow = tuple[str, str]


@dataclass
class _Rows:
    """The rows of ``keys`` developer keys and ``others`` more, made batch by batch;
    ``sample`` and ``unused`` fill as the batches are taken."""

    organization_id: str
    hasher: Hasher
    keys: int
    rotate: int
    others: int
    seed_value: int
    sample: list[Credential] = field(default_factory=list)
    unused: list[str] = field(default_factory=list)
    credited: list[Credential] = field(default_factory=list)
    limited: list[Credential] = field(default_factory=list)
    identified: list[Credential] = field(default_factory=list)
    both: list[Credential] = field(default_factory=list)

    def credit_rows(self) -> list[tuple[str, int, int]]:
        """key_details rows giving the ``credited`` keys credits (taken after ``batches``)."""
        return [(cred.id, CREDITS, CREDITS) for cred in self.credited]

    def limit_rows(self) -> list[tuple[str, str]]:
        """key_details rows giving the ``limited`` keys a named limit (after ``batches``)."""
        return [(cred.id, LIMITS) for cred in self.limited]

    def _external_id(self, place: int) -> str:
        return f"bench-customer-{place // KEYS_PER_IDENTITY:05d}"

    def identity_rows(self) -> list[tuple[object, ...]]:
        """The identities of the ``identified`` and ``both`` keys, with credits."""
        now = to_text(utcnow())
        rng = random.Random(self.seed_value)  # noqa: S311 - benchmark data, see the module
        count = (len(self.identified) + len(self.both)) // KEYS_PER_IDENTITY
        return [
            (str(uuid.UUID(int=rng.getrandbits(128), version=4)), self.organization_id,
             number + 1, self._external_id(number * KEYS_PER_IDENTITY), CREDITS, CREDITS,
             now, now)
            for number in range(count)
        ]  # fmt: skip

    def member_rows(self) -> list[tuple[str, str, int | None, int | None]]:
        """key_details rows putting the ``identified`` keys (no credits of their own) and
        then the ``both`` keys (credits of their own) in the identities."""
        rows: list[tuple[str, str, int | None, int | None]] = []
        for place, cred in enumerate([*self.identified, *self.both]):
            own = CREDITS if place >= len(self.identified) else None
            rows.append((cred.id, self._external_id(place), own, own))
        return rows

    def batches(self) -> Iterator[tuple[list[KeyRow], list[RoleRow]]]:
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
        created_at = to_text(utcnow())
        used_at = to_text(to_minute(utcnow()))
        key_rows: list[KeyRow] = []
        role_rows: list[RoleRow] = []
        for index, cred in enumerate(_credentials(rng, self.keys + self.others)):
            if index in chosen:
                self.sample.append(cred)
            if index >= first_credited:
                self.credited.append(cred)
            elif index >= first_limited:
                self.limited.append(cred)
            elif index >= first_both:
                self.both.append(cred)
            elif index >= first_identified:
                self.identified.append(cred)
            if index >= self.keys:
                self.unused.append(cred.id)
            key_rows.append(
                (
                    cred.id,
                    self.organization_id,
                    f"bench-{index:07d}",  # one width: every answer the same size
                    self.hasher.keyed(sha256_b64(cred.key_id)),
                    self.hasher.keyed(sha256_b64(cred.secret)),
                    cred.key_id[-SUFFIX_LENGTH:],
                    created_at,
                    used_at if index >= self.keys else None,
                    index + 2,
                )
            )
            role_rows.append((cred.id, DEVELOPER_ROLE))
            if len(key_rows) >= BATCH:
                yield key_rows, role_rows
                key_rows, role_rows = [], []
        yield key_rows, role_rows

    def seeded(self, db: str, admin: Credential) -> Seeded:
        return Seeded(
            db,
            self.organization_id,
            admin,
            self.keys,
            self.sample,
            self.unused,
            self.credited,
            self.limited,
            self.identified,
            self.both,
        )


def seed(db: Path, keys: int, rotate: int = 1000, seed_value: int = 1, others: int = 0) -> Seeded:
    """Create ``db`` (which must not exist) with an admin key, ``keys`` developer keys
    and ``others`` more that only the admin reads."""
    if db.exists():
        raise FileExistsError(f"{db} exists; seed a fresh path")
    organization_id, admin = bootstrap(db)
    # The pepper file that keysvc serve will read: <db>.pepper (no KEYSVC_PEPPER is passed).
    hasher = Hasher(load_pepper(None, db.with_name(db.name + ".pepper")))
    rows = _Rows(organization_id, hasher, keys, rotate, others, seed_value)
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        # A throwaway benchmark database: durability while seeding buys nothing.
        conn.execute("pragma synchronous = off")
        conn.execute("pragma cache_size = -262144")
        conn.execute("begin immediate")
        for key_rows, role_rows in rows.batches():
            conn.executemany(_INSERT_KEY, key_rows)
            conn.executemany(_INSERT_ROLE, role_rows)
        conn.executemany(_INSERT_CREDITS, rows.credit_rows())
        conn.executemany(_INSERT_LIMITS, rows.limit_rows())
        conn.executemany(_INSERT_IDENTITY, rows.identity_rows())
        conn.executemany(_INSERT_MEMBER, rows.member_rows())
        conn.execute("commit")
        conn.execute("pragma wal_checkpoint(truncate)")
    finally:
        conn.close()
    return rows.seeded(str(db), admin)


def seed_postgres(
    url: str, pepper: str, keys: int, rotate: int = 1000, seed_value: int = 1, others: int = 0
) -> Seeded:
    """``seed`` on the empty PostgreSQL database at ``url``, whose instances run with
    KEYSVC_PEPPER ``pepper``: the same keys (the same ``seed_value``), bootstrapped by
    keysvc and inserted in one transaction, its triggers counting them as on SQLite."""
    organization_id, admin = bootstrap(url, {"KEYSVC_PEPPER": pepper})
    rows = _Rows(organization_id, Hasher(pepper.encode()), keys, rotate, others, seed_value)
    asyncio.run(_insert_postgres(url, rows))
    return rows.seeded(url, admin)


async def _insert_postgres(url: str, rows: _Rows) -> None:
    conn = await connect_postgres(url)
    try:
        async with conn.raw.transaction():
            for key_rows, role_rows in rows.batches():
                await conn.executemany(_INSERT_KEY, key_rows)
                await conn.executemany(_INSERT_ROLE, role_rows)
            await conn.executemany(_INSERT_CREDITS, rows.credit_rows())
            await conn.executemany(_INSERT_LIMITS, rows.limit_rows())
            await conn.executemany(_INSERT_IDENTITY, rows.identity_rows())
            await conn.executemany(_INSERT_MEMBER, rows.member_rows())
    finally:
        await conn.close()


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
