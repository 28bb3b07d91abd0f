"""No write without its activity, no activity without its write: a real server is
killed with SIGKILL while clients create, rename, disable and delete keys and
create, rename and delete roles; the database left behind must hold, for every key
and role, the activities that made it what it is, and for every activity its change;
and its chains must verify."""

import asyncio
import json
import random
import signal
import sqlite3
from collections import defaultdict
from pathlib import Path
from typing import Any

import aiohttp

from tests.helpers import Creds
from tests.server import Server, admin_creds, bootstrap, integrity, keysvc

WORKERS = 12
KILL_AFTER = 150  # answered writes before the kill; the workers go on until it lands
TIMEOUT = aiohttp.ClientTimeout(total=30)


class Stream:
    def __init__(self, base: str, admin: Creds, server: Server):
        self.org = f"{base}/v1/organizations/{admin.organization_id}"
        self.admin = admin
        self.server = server
        self.acks = 0
        self.killed = False

    async def send(
        self, session: aiohttp.ClientSession, method: str, url: str, body: Any = None
    ) -> dict[str, Any] | None:
        try:
            async with session.request(method, url, json=body) as response:
                answer = await response.json()
        except (TimeoutError, aiohttp.ClientError, ValueError):
            return None
        assert response.status == 200, answer
        self.acks += 1
        if self.acks >= KILL_AFTER and not self.killed:
            self.killed = True
            self.server.proc.send_signal(signal.SIGKILL)
        return answer

    async def worker(self, session: aiohttp.ClientSession, n: int) -> None:
        rng = random.Random(n)
        keys: list[str] = []
        roles: list[str] = []
        step = 0
        while True:
            step += 1
            name = f"w{n}-{step}"
            roll = rng.random()
            if not keys or roll < 0.3:
                body = {"name": name, "roles": ["developer"]}
                answer = await self.send(session, "POST", f"{self.org}/keys", body)
                if answer is not None:
                    keys.append(answer["result"]["key"]["id"])
            elif roll < 0.6:
                patch = {"name": name, "state": rng.choice(["enabled", "disabled"])}
                answer = await self.send(
                    session, "PATCH", f"{self.org}/keys/{rng.choice(keys)}", patch
                )
            elif roll < 0.7:
                answer = await self.send(session, "DELETE", f"{self.org}/keys/{keys.pop()}")
            elif not roles or roll < 0.8:
                body = {"name": name, "permissions": ["keys:read"]}
                answer = await self.send(session, "POST", f"{self.org}/roles", body)
                if answer is not None:
                    roles.append(answer["result"]["id"])
            elif roll < 0.9:
                answer = await self.send(
                    session, "PATCH", f"{self.org}/roles/{rng.choice(roles)}", {"name": name}
                )
            else:
                answer = await self.send(session, "DELETE", f"{self.org}/roles/{roles.pop()}")
            if answer is None:
                return  # the server is gone


async def drive(stream: Stream) -> None:
    async with aiohttp.ClientSession(headers=stream.admin.headers, timeout=TIMEOUT) as session:
        await asyncio.gather(*(stream.worker(session, n) for n in range(WORKERS)))


def rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(db)
    try:
        return list(conn.execute(sql))
    finally:
        conn.close()


def test_every_change_has_its_activity_and_every_activity_its_change(tmp_path: Path) -> None:
    db = tmp_path / "keysvc.db"
    admin = admin_creds(bootstrap(db))
    with Server(db, env={"KEYSVC_MAX_KEYS_PER_ORG": "100000"}) as server:
        stream = Stream(server.base, admin, server)
        asyncio.run(drive(stream))
        server.proc.wait(timeout=30)
        assert server.proc.returncode == -signal.SIGKILL
    assert stream.killed
    assert integrity(db) == ["ok"]
    log = rows(
        db,
        "select type, key_update_type, target_key_id, target_role_id, before, after"
        " from activities order by org_seq",
    )
    # What the log says each key and role is now: replayed from its activities.
    keys: dict[str, dict[str, Any] | None] = {}
    roles: dict[str, dict[str, Any] | None] = {}
    counts: defaultdict[str, int] = defaultdict(int)
    for kind, _, key_id, role_id, before, after in log:
        counts[kind] += 1
        changed = json.loads(after) if after else {}
        if kind == "key_create":
            assert key_id not in keys
            keys[key_id] = changed
        elif kind == "openapi_key_update":
            current = keys[key_id]
            assert current is not None
            assert all(current[field] == value for field, value in json.loads(before).items())
            current.update(changed)
        elif kind == "key_delete":
            assert keys[key_id] is not None
            keys[key_id] = None
        elif kind == "role_create":
            roles[role_id] = changed
        elif kind == "role_update":
            current = roles[role_id]
            assert current is not None
            current.update(changed)
        elif kind == "role_delete":
            roles[role_id] = None
    assert min(counts.values()) > 0 and len(counts) == 6, counts
    stored_keys = dict(rows(db, "select id, json_array(name, state) from api_keys"))
    assert set(stored_keys) == {k for k, v in keys.items() if v is not None}
    for key_id, seen in keys.items():
        if seen is not None:
            assert json.loads(stored_keys[key_id]) == [seen["name"], seen["state"]]
    stored_roles = dict(rows(db, "select id, name from roles where type = 'custom'"))
    assert stored_roles == {r: v["name"] for r, v in roles.items() if v is not None}
    done = keysvc("audit", "verify", "--db", str(db))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"audit log intact: {len(log)} activities")
