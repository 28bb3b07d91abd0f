"""Two real `keysvc serve` processes on one PostgreSQL database (tests/postgres.py)
behind a real nginx, run with docs/nginx-two-instances.conf beside the shipped
docs/nginx-auth-request.conf (tests/system/test_nginx.py starts it): round robin
over both instances' unix sockets, for keysvc's API and for the auth subrequest
in front of a protected upstream. Every request goes through nginx, and each
instance's access log shows it served its share. Whatever one instance changes
through the API, both answer accordingly from the very next request, whichever
instance it reaches, and never go back (the writer returns once the other has
acknowledged the change); one instance killed, nginx sends everything to the
other (an auth subrequest that found it gone is not sent again: a 500 or 503); one
instance's notification connection killed, its caches are cold at once and it
answers right from its very next request.
"""

import json
import re
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from keysvc.db.postgres.notifications import LISTENER_PREFIX
from tests.helpers import Creds
from tests.nginx import (
    CLIENT,
    Answer,
    Nginx,
    Upstream,
    call,
    nginx_binary,
    two_instance_config,
)
from tests.postgres import PEPPER, Postgres
from tests.server import Server, admin_creds, free_port, keysvc

ROOT = Path(__file__).resolve().parents[2]
# Generous, for a loaded machine.
WAIT_SECONDS = 30.0
READS = 20
KEY_ROUTE = "/v1/organizations/{organizationId}/keys/{keyId}"
AFTER = 50
ROUNDS = 100


def access_lines(server: Server) -> list[dict[str, Any]]:
    # Whole lines only: the server may be writing the last one as it is read.
    text = server.stderr_text()
    whole = text[: text.rfind("\n") + 1]
    lines = [json.loads(line) for line in whole.splitlines() if line.strip()]
    return [line for line in lines if line.get("logger") == "keysvc.access"]


@dataclass
class Stack:
    nginx: Nginx
    api_port: int
    instances: tuple[Server, Server]
    upstream: Upstream
    admin: Creds
    postgres: Postgres
    database: str

    def api(self, method: str, path: str, body: Any = None) -> Any:
        """keysvc's API through nginx, as the admin; the answer's result."""
        url = f"/v1/organizations/{self.admin.organization_id}{path}"
        answer = call(
            self.api_port, url, method=method, headers=self.admin.headers, body=body, source=CLIENT
        )
        assert answer.status == 200, (answer.status, answer.body, self.nginx.log()[-2000:])
        return answer.json().get("result")

    def create_key(self, **fields: Any) -> Creds:
        result = self.api("POST", "/keys", {"name": "behind nginx", **fields})
        return Creds(
            self.admin.organization_id, result["key"]["id"], result["keyId"], result["keySecret"]
        )

    def get(self, creds: Creds, path: str = "/orders") -> Answer:
        """A request to the protected upstream through nginx, from the client's address."""
        return call(self.nginx.port, path, headers=creds.headers, source=CLIENT)

    def statuses(self, creds: Creds, count: int, path: str = "/orders") -> list[int]:
        return [self.get(creds, path).status for _ in range(count)]

    def seen_by_both(self, creds: Creds, status: int, path: str = "/orders") -> None:
        """The very next request, and AFTER more, answer ``status``, round robin over
        both instances: the one that made the change, and the other, which had
        acknowledged it before the change's answer was sent (docs/SECURITY.md)."""
        before = self.verified()
        assert self.statuses(creds, 1 + AFTER, path) == [status] * (1 + AFTER)
        self.both_answered(before, status)

    def verified(self) -> list[list[int]]:
        """The statuses each instance has answered /v1/verify with so far."""
        return [
            [line["status"] for line in access_lines(server) if line["route"] == "/v1/verify"]
            for server in self.instances
        ]

    def both_answered(self, before: list[list[int]], status: int) -> None:
        """Each instance answered some verify since ``before`` with ``status`` (waited
        for: an instance writes its access lines in batches)."""
        deadline = time.monotonic() + WAIT_SECONDS
        while not all(
            status in now[len(seen) :] for seen, now in zip(before, self.verified(), strict=True)
        ):
            assert time.monotonic() < deadline, (status, before, self.verified())
            time.sleep(0.1)

    def terminate_after_probe(self, pid: int) -> None:
        self.postgres.psql(self.database, TERMINATE_AFTER_PROBE.format(pid=int(pid)))

    def listener_pid(self, server: Server) -> int:
        """The server process of an instance's listening connection, named after the
        instance's process (keysvc.db.postgres.notifications.Notifications)."""
        name = f"{LISTENER_PREFIX}{server.proc.pid}.%"
        sql = f"select pid from pg_stat_activity where application_name like '{name}'"
        deadline = time.monotonic() + WAIT_SECONDS
        while not (rows := self.postgres.psql(self.database, sql)):
            assert time.monotonic() < deadline, f"no listening connection of {name}"
            time.sleep(0.1)
        (pid,) = [int(row[0]) for row in rows]
        return pid


# Waits for the listening connection's next probe to begin, then ends its server
# process at once (and waits for it to be gone): the next probe is a whole
# PROBE_SECONDS away, so only the connection's closing can tell the instance.
TERMINATE_AFTER_PROBE = """
do $$
declare
    seen timestamptz := (select query_start from pg_stat_activity where pid = {pid});
begin
    loop
        perform pg_stat_clear_snapshot();
        exit when (select query_start from pg_stat_activity where pid = {pid}) <> seen;
        perform pg_sleep(0.005);
    end loop;
    perform pg_terminate_backend({pid}, 10000);
end $$;
"""


@contextmanager
def started(
    postgres: Postgres, database: str, directory: Path, b_env: dict[str, str]
) -> Iterator[Stack]:
    """Both instances, nginx and the protected upstream; ``b_env`` is more settings for
    the second instance."""
    url = postgres.url(database)
    env = {
        "KEYSVC_PEPPER": PEPPER.hex(),
        # nginx's X-Forwarded-For is believed on the sockets alone; no default rate
        # limit, and room for the refusals the tests count; an access line for every
        # answer, to tell which instance served what; no verify answer reused by nginx,
        # so that the very next request reaches an instance (tests/system/test_nginx_reuse.py
        # checks the reuse bound).
        "KEYSVC_TRUSTED_PROXIES": "",
        "KEYSVC_VERIFY_REUSE_SECONDS": "0",
        "KEYSVC_RATE_LIMIT": "off",
        "KEYSVC_AUTH_FAILURES": "100000",
        "KEYSVC_ACCESS_LOG": "all",
    }
    done = keysvc("bootstrap", "--db", url, env=env)
    assert done.returncode == 0, done.stderr
    admin = admin_creds(json.loads(done.stdout))
    sockets = (directory / "a.sock", directory / "b.sock")
    with ExitStack() as resources:
        upstream = Upstream()
        resources.callback(upstream.stop)
        a, b = (
            resources.enter_context(Server(url, env=more, unix=socket, tcp=False))  # type: ignore[arg-type]
            for socket, more in zip(sockets, (env, {**env, **b_env}), strict=True)
        )
        nginx = Nginx(nginx_binary(), directory, sockets[0], upstream.base, admin.organization_id)
        api_port = free_port()
        nginx.conf.write_text(
            two_instance_config(nginx, api_port, sockets, upstream.base, admin.organization_id)
        )
        nginx.test_config()
        resources.callback(nginx.stop)
        nginx.start()
        yield Stack(nginx, api_port, (a, b), upstream, admin, postgres, database)


@pytest.fixture
def stack(postgres: Postgres, pg_database: str, tmp_path: Path) -> Iterator[Stack]:
    with started(postgres, pg_database, tmp_path, {}) as made:
        yield made


@pytest.fixture
def b_uncached(postgres: Postgres, pg_database: str, tmp_path: Path) -> Iterator[Stack]:
    """The second instance keeps no credentials in memory: it reads every one."""
    with started(postgres, pg_database, tmp_path, {"KEYSVC_CACHE_SIZE": "0"}) as made:
        yield made


def test_the_postgresql_page_includes_the_two_instance_config_that_is_tested() -> None:
    """docs/operations/postgresql.md shows docs/nginx-two-instances.conf itself, included
    at build time (tests/system/test_docs_site.py checks the built page); the README
    holds no copy."""
    page = (ROOT / "docs" / "operations" / "postgresql.md").read_text()
    shown = re.findall(r"```nginx\n(.*?)```", page, re.S)
    assert shown == ['--8<-- "docs/nginx-two-instances.conf"\n']
    assert "# Two keysvc instances" not in (ROOT / "README.md").read_text()


def test_nginx_accepts_the_two_instance_config_and_both_instances_are_ready(
    stack: Stack,
) -> None:
    output = stack.nginx.test_config()
    assert "[warn]" not in output and "[emerg]" not in output, output
    for server in stack.instances:  # the active health check the PostgreSQL page shows
        status, _, body = server.unix_request("GET", "/readyz")
        assert status == 200, body
        assert json.loads(body)["result"] == {"status": "ready"}


def test_a_key_created_through_one_is_read_and_verified_through_both_at_once(
    stack: Stack,
) -> None:
    before = stack.verified()
    reads = [len(access_lines(server)) for server in stack.instances]
    key = stack.create_key(roles=["developer"])
    # One after another (round robin counts the API's requests and the auth
    # subrequests alike: interleaved, each kind would go to one instance).
    for _ in range(READS):
        assert stack.api("GET", f"/keys/{key.id}")["name"] == "behind nginx"
    for _ in range(READS):
        answer = stack.get(key)
        assert answer.status == 200, answer.body
        assert answer.json()["headers"]["X-Key-Id"] == key.id
    stack.both_answered(before, 200)
    # And each served some of the reads.
    deadline = time.monotonic() + WAIT_SECONDS
    while not all(
        KEY_ROUTE in [line["route"] for line in access_lines(server)[count:]]
        for server, count in zip(stack.instances, reads, strict=True)
    ):
        assert time.monotonic() < deadline, "one instance served none of the reads"
        time.sleep(0.1)


def test_a_disabled_key_is_refused_by_both_and_stays_refused(stack: Stack) -> None:
    key = stack.create_key(roles=["developer"])
    assert stack.statuses(key, 4) == [200] * 4  # cached by both
    assert stack.api("PATCH", f"/keys/{key.id}", {"state": "disabled"})["state"] == "disabled"
    stack.seen_by_both(key, 401)


def test_disabled_and_enabled_again_many_times_the_very_next_request_agrees(
    stack: Stack,
) -> None:
    # Round robin takes turns over the API's requests and the auth subrequests alike:
    # the request after a change mostly reaches the instance that did not make it.
    key = stack.create_key(roles=["developer"])
    missed = []
    for round_ in range(ROUNDS):
        for state, status in (("enabled", 200), ("disabled", 401)):
            assert stack.api("PATCH", f"/keys/{key.id}", {"state": state})["state"] == state
            if (answer := stack.get(key).status) != status:
                missed.append((round_, state, answer))
    assert not missed, f"{len(missed)} stale answers in {ROUNDS} rounds: {missed}"


def test_a_key_rotated_without_grace_works_only_with_its_new_secret(stack: Stack) -> None:
    old = stack.create_key(roles=["developer"])
    assert stack.statuses(old, 4) == [200] * 4
    rotated = stack.api("POST", f"/keys/{old.id}/rotate", {"gracePeriodSeconds": 0})
    new = Creds(old.organization_id, old.id, rotated["keyId"], rotated["keySecret"])
    # The new key ID was never cached anywhere: accepted by both from the first request.
    before = stack.verified()
    assert stack.statuses(new, 10) == [200] * 10
    stack.both_answered(before, 200)
    stack.seen_by_both(old, 401)
    assert stack.statuses(new, 10) == [200] * 10


def test_a_deleted_key_is_refused_everywhere(stack: Stack) -> None:
    key = stack.create_key(roles=["developer"])
    assert stack.statuses(key, 4) == [200] * 4
    stack.api("DELETE", f"/keys/{key.id}")
    stack.seen_by_both(key, 401)


def test_a_role_permission_change_is_seen_by_both(stack: Stack) -> None:
    role = stack.api("POST", "/roles", {"name": "orders", "permissions": ["orders:read"]})
    key = stack.create_key(assignedRoleIds=[role["id"]])
    assert stack.statuses(key, 4, "/reports/q1") == [403] * 4
    granted = ["orders:read", "reports:read"]
    stack.api("PATCH", f"/roles/{role['id']}", {"permissions": granted})
    stack.seen_by_both(key, 200, "/reports/q1")
    stack.api("PATCH", f"/roles/{role['id']}", {"permissions": ["orders:read"]})
    stack.seen_by_both(key, 403, "/reports/q1")


def test_one_instance_killed_the_other_answers_everything_right(stack: Stack) -> None:
    a, _ = stack.instances
    key = stack.create_key(roles=["developer"])
    assert stack.statuses(key, 4) == [200] * 4
    a.proc.send_signal(signal.SIGKILL)
    assert a.proc.wait(timeout=WAIT_SECONDS) == -signal.SIGKILL  # b answers from now on
    # An auth subrequest is never sent to a second instance (it may have been carried
    # out): the one that finds a gone gets a 500 (or a 503 with Retry-After when it
    # could not connect), then a is left out for fail_timeout (10 s; past it, one more
    # request may try a).
    answered(stack.statuses(key, 10), 200)
    assert stack.api("GET", f"/keys/{key.id}")["state"] == "enabled"
    assert stack.api("PATCH", f"/keys/{key.id}", {"state": "disabled"})["state"] == "disabled"
    answered(stack.statuses(key, 10), 401)
    later = stack.create_key(roles=["developer"])
    answered(stack.statuses(later, 10), 200)


def answered(statuses: list[int], status: int) -> None:
    """Every request answered ``status`` but at most one 500 or 503, whose auth
    subrequest went to the killed instance."""
    failed = [answer for answer in statuses if answer in (500, 503)]
    assert len(failed) <= 1 and set(statuses) <= {status, 500, 503}, statuses


def test_a_killed_notification_connection_leaves_no_stale_answer(b_uncached: Stack) -> None:
    # b reads every credential, so any stale answer would be a's, whose listening
    # connection is killed: its caches must turn cold at once.
    stack = b_uncached
    a, _ = stack.instances
    key = stack.create_key(roles=["developer"])
    assert stack.statuses(key, 4) == [200] * 4  # cached by a
    listener = stack.listener_pid(a)
    # Requests keep flowing meanwhile: each with when it started and its status.
    flowing: list[tuple[float, int]] = []
    stop = threading.Event()

    def flow() -> None:
        while not stop.is_set():
            started = time.monotonic()
            flowing.append((started, stack.get(key).status))

    thread = threading.Thread(target=flow, name="flow", daemon=True)
    thread.start()
    try:
        stack.terminate_after_probe(listener)
        before = stack.verified()
        # Disabled by hand, as an operator would: neither instance made the change,
        # so a can only learn of it from the database.
        disable = f"update api_keys set state = 'disabled' where id = '{key.id}'"
        stack.postgres.psql(stack.database, disable)
        disabled_at = time.monotonic()
        # The very next request, and every one after, to either instance.
        assert stack.statuses(key, 1 + AFTER) == [401] * (1 + AFTER)
        stack.both_answered(before, 401)
    finally:
        stop.set()
        thread.join(WAIT_SECONDS)
    stale = [status for started, status in flowing if started > disabled_at and status != 401]
    assert not stale, stale
    # The connection was lost, and a new one listens.
    deadline = time.monotonic() + WAIT_SECONDS
    while "PostgreSQL notifications back" not in a.stderr_text():
        assert time.monotonic() < deadline, a.stderr_text()[-2000:]
        time.sleep(0.1)
    assert "lost the PostgreSQL notification connection" in a.stderr_text()
    assert stack.listener_pid(a) != listener
    assert stack.statuses(key, 10) == [401] * 10
