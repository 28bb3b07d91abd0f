"""Secret hygiene: after a whole session against a real server, no secret and no
full key ID is anywhere they could leak from.

The session: generated and ``hashData`` creates, authentications on every kind
of route, failed logins of every kind (some carrying a real secret in the wrong
place), errors that echo input, a backup taken while serving, and /metrics.
Then every place is scanned for every credential used, in the forms that would
let someone use or attack it: the plain key ID and secret, the Basic token,
and the unkeyed SHA-256 forms a client sends in ``hashData``:

- the database file and its WAL, while serving and after the stop;
- the backup;
- every log line, at debug level;
- every response, headers and body, except the one create response that
  hands the credentials out;
- /metrics.
"""

import asyncio
import base64
import hashlib
import json
import secrets
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from keysvc.credentials import sha256_b64
from tests.helpers import basic, hash_data
from tests.server import Server, bootstrap


@dataclass(frozen=True)
class Pair:
    key_id: str
    secret: str

    @property
    def headers(self) -> dict[str, str]:
        return basic(self.key_id, self.secret)

    def needles(self) -> list[bytes]:
        """Every form of this pair that must not leak."""
        token = base64.b64encode(f"{self.key_id}:{self.secret}".encode()).decode()
        found = [token]
        for value in (self.key_id, self.secret):
            digest = hashlib.sha256(value.encode()).digest()
            found += [value, sha256_b64(value), digest.hex()]
        return [needle.encode() for needle in found]


@dataclass
class Session:
    """Talks to one server; keeps every response, headers and body, apart from
    the create answers, which are kept on their own."""

    http: aiohttp.ClientSession
    base: str
    organization_id: str
    seen: list[bytes] = field(default_factory=list)
    creates: list[bytes] = field(default_factory=list)

    async def call(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        async with self.http.request(method, self.base + path, **kwargs) as response:
            body = await response.read()
            assert response.status < 500, body
            head = "".join(f"{name}: {value}\n" for name, value in response.headers.items())
            self.seen.append(head.encode() + body)
            return response.status, json.loads(body) if body.startswith(b"{") else None

    async def create(self, admin: Pair, body: dict[str, Any]) -> dict[str, Any]:
        """The one call whose answer may carry credentials: kept apart from the rest."""
        status, answer = await self.call("POST", self.keys, json=body, headers=admin.headers)
        assert status == 200, answer
        self.creates.append(self.seen.pop())
        result: dict[str, Any] = answer["result"]
        return result

    @property
    def keys(self) -> str:
        return f"/v1/organizations/{self.organization_id}/keys"


async def run_session(session: Session, db: Path, admin: Pair) -> list[Pair]:
    """Everything a busy day does; returns the pairs it made besides the admin's."""
    made: list[Pair] = []
    for number in range(3):
        result = await session.create(admin, {"name": f"gen {number}", "roles": ["developer"]})
        made.append(Pair(result["keyId"], result["keySecret"]))
    own = Pair(f"own-{secrets.token_hex(8)}", secrets.token_urlsafe(32))
    await session.create(
        admin,
        {"name": "own", "roles": ["developer"], "hashData": hash_data(own.key_id, own.secret)},
    )
    made.append(own)
    victim = made[0]
    _, answer = await session.call("GET", "/v1/whoami", headers=victim.headers)
    victim_id = answer["result"]["id"]

    organization_id = session.organization_id
    for pair in [admin, *made]:
        for method, path in (
            ("GET", "/v1/whoami"),
            ("GET", session.keys),
            ("GET", f"{session.keys}/{victim_id}"),
            ("GET", "/v1/verify"),
            ("POST", "/v1/verify?permission=keys:read"),
            ("HEAD", "/v1/verify"),
            ("GET", f"/v1/organizations/{organization_id}/roles"),
        ):
            status, _ = await session.call(method, path, headers=pair.headers)
            assert status in (200, 403)

    last = "A" if victim.secret[-1] != "A" else "B"
    for headers in (
        basic(victim.key_id, victim.secret[:-1] + last),
        basic(victim.key_id, "not-the-secret"),
        basic("unknown-" + victim.key_id, victim.secret),
        basic(victim.secret, victim.key_id),  # swapped
        {"Authorization": f"Bearer {victim.secret}"},
        {"Authorization": victim.secret},
        {"Authorization": f"Basic {victim.secret}"},  # not base64 of id:secret
        {"X-Api-Key": victim.secret},
    ):
        for path in ("/v1/whoami", "/v1/verify", session.keys):
            status, _ = await session.call("GET", path, headers=headers)
            assert status == 401

    # Errors that might echo what they were given.
    for payload in (
        {"name": "x", "roles": [victim.secret]},
        {"name": "x", "roles": ["developer"], "keySecret": victim.secret},
        {"name": "x", "roles": ["developer"], "hashData": {"keyIdHash": victim.key_id}},
        {
            "name": "x",
            "roles": ["developer"],
            "hashData": {
                "keyIdHash": victim.key_id,
                "keyIdSuffix": victim.key_id[-4:],
                "keySecretHash": victim.secret,
            },
        },
        {"name": "x", "roles": ["developer"], "expireAt": victim.secret},
        {"name": "x", "roles": ["developer"], "ipAccessList": [{"source": victim.secret}]},
        {"name": "x", "roles": ["developer"], "assignedRoleIds": [victim.secret]},
    ):
        status, _ = await session.call("POST", session.keys, json=payload, headers=admin.headers)
        assert status == 400
    for path in (
        f"{session.keys}/{victim.key_id}",
        f"{session.keys}?cursor={victim.secret}",
        f"{session.keys}?limit={victim.secret}",
        f"/v1/{victim.secret}",
        f"/v1/verify?permission={victim.secret}",
    ):
        status, _ = await session.call("GET", path, headers=admin.headers)
        assert 400 <= status < 500
    status, _ = await session.call(
        "POST", session.keys, data=victim.secret.encode(), headers=admin.headers
    )
    assert status == 415
    status, _ = await session.call(
        "PATCH",
        f"{session.keys}/{victim_id}",
        data=victim.secret.encode(),
        headers={**admin.headers, "Content-Type": "application/json"},
    )
    assert status == 400

    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "keysvc", "backup", "--db", str(db), str(db.parent / "backup.db")],
        capture_output=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    session.seen.append(done.stdout + done.stderr)

    # Keys are used and deleted after the backup too.
    for pair in made:
        status, _ = await session.call("GET", "/v1/whoami", headers=pair.headers)
        assert status == 200
    status, _ = await session.call("DELETE", f"{session.keys}/{victim_id}", headers=admin.headers)
    assert status == 200
    status, _ = await session.call("GET", "/v1/whoami", headers=victim.headers)
    assert status == 401
    status, _ = await session.call("GET", "/metrics")
    assert status == 200
    return made


async def serve_session(
    base: str, db: Path, admin: Pair, organization_id: str
) -> tuple[list[Pair], Session]:
    async with aiohttp.ClientSession() as http:
        session = Session(http, base, organization_id)
        made = await run_session(session, db, admin)
        return made, session


def leaks(place: str, data: bytes, pairs: list[Pair]) -> list[str]:
    return [
        f"{place} holds {needle[:12]!r}..."
        for pair in pairs
        for needle in pair.needles()
        if needle in data
    ]


def test_no_credential_anywhere_after_a_busy_session(tmp_path: Path) -> None:
    db = tmp_path / "keysvc.db"
    created = bootstrap(db)
    admin = Pair(created["keyId"], created["keySecret"])
    wal = Path(f"{db}-wal")
    # Every access line, verify successes included: the more the log holds, the more is scanned.
    env = {"KEYSVC_LOG_LEVEL": "debug", "KEYSVC_AUTH_FAILURES": "1000", "KEYSVC_ACCESS_LOG": "all"}
    with Server(db, env=env) as server:
        made, session = asyncio.run(
            serve_session(server.base, db, admin, created["organizationId"])
        )
        places: dict[str, bytes] = {
            "the database while serving": db.read_bytes(),
            "the WAL while serving": wal.read_bytes(),
        }
        server.stop()
        logs = server.stderr_text().encode()
    places["the database after the stop"] = db.read_bytes()
    places["the backup"] = (tmp_path / "backup.db").read_bytes()
    places["the debug log"] = logs
    if wal.exists():
        places["the WAL after the stop"] = wal.read_bytes()
    for number, response in enumerate(session.seen):
        places[f"response {number}"] = response
    pairs = [admin, *made]
    found = [leak for place, data in places.items() for leak in leaks(place, data, pairs)]
    assert found == []

    # The scan looked at real material: the session ran, was logged at debug level,
    # the WAL was in use, and /metrics was read.
    assert len(session.seen) > 80
    assert logs.count(b'"logger": "keysvc.access"') > 80
    assert b'"level": "debug"' in logs
    assert len(places["the WAL while serving"]) > 0
    assert b"keysvc_auth_outcomes_total" in session.seen[-1]
    # ...and it can fail: the create answers, the only ones left out, do hold them.
    assert leaks("create", b"".join(session.creates), made[:3])
