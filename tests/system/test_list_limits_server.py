"""Long lists against a real `keysvc serve`: /healthz stays fast while clients send
bodies with long lists."""

import http.client
import json
import statistics
import threading
import time
from pathlib import Path

from tests.helpers import ENTRIES
from tests.server import Server, admin_creds, bootstrap


def _median_healthz(port: int, count: int) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        times = []
        for _ in range(count):
            started = time.perf_counter()
            conn.request("GET", "/healthz")
            response = conn.getresponse()
            response.read()
            times.append(time.perf_counter() - started)
            assert response.status == 200
        return statistics.median(times)
    finally:
        conn.close()


def test_healthz_stays_fast_while_clients_send_long_lists(tmp_path: Path) -> None:
    db = tmp_path / "keysvc.db"
    admin = admin_creds(bootstrap(db))
    payload = json.dumps({"name": "k", "roles": ["x"] * ENTRIES}).encode()
    url = f"/v1/organizations/{admin.organization_id}/keys"
    headers = {**admin.headers, "Content-Type": "application/json"}
    with Server(db) as server:
        idle = _median_healthz(server.port, 30)
        stop, refused, failures = threading.Event(), [0] * 4, []
        started = threading.Barrier(5, timeout=60)

        def send(index: int) -> None:
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
            try:
                while not stop.is_set():
                    conn.request("POST", url, body=payload, headers=headers)
                    response = conn.getresponse()
                    response.read()
                    if response.status != 400:
                        failures.append(response.status)
                    refused[index] += 1
                    if refused[index] == 1:
                        started.wait()
            finally:
                conn.close()

        senders = [threading.Thread(target=send, args=(i,)) for i in range(4)]
        for sender in senders:
            sender.start()
        try:
            started.wait()  # every sender has had a body refused: all four are at it
            loaded = _median_healthz(server.port, 30)
            sent = sum(refused)
        finally:
            stop.set()
            for sender in senders:
                sender.join(timeout=60)
    assert failures == []
    assert sum(refused) > sent >= 4
    # A refusal costs about what a /healthz does: a few waiting ahead of it, not seconds.
    assert loaded < 10 * idle + 0.15, (idle, loaded)
