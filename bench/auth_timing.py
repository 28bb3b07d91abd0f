"""How long a 401 takes: an unknown key ID against a wrong secret for a cached key.

Both must look the same to the caller (docs/SECURITY.md, "Guessing and brute
force"), time included. This starts a real ``keysvc serve`` on a fresh database
(failed-login throttling set out of reach), caches the admin key with one good
request, then sends GET /v1/whoami with each kind of bad credentials in turn
over one keep-alive connection and prints the median and 10th percentile.

    python -m bench.auth_timing [--requests 1500]
"""

import argparse
import base64
import http.client
import statistics
import tempfile
import time
from pathlib import Path

from bench.seed import bootstrap
from bench.servers import HOST, start_keysvc
from keysvc.credentials import new_key_id, new_secret

KINDS = ("unknown key ID", "wrong secret, cached key")


def _basic(key_id: str, secret: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{key_id}:{secret}".encode()).decode()}


def measure(requests: int) -> dict[str, list[float]]:
    """Microseconds per 401, by kind, ``requests`` of each, alternating."""
    with tempfile.TemporaryDirectory() as work:
        db = Path(work) / "keysvc.db"
        _, admin = bootstrap(db)
        env = {"KEYSVC_AUTH_FAILURES": str(10 * requests)}
        with start_keysvc(db, Path(work) / "keysvc.log", env) as server:
            connection = http.client.HTTPConnection(HOST, server.port)

            def status(headers: dict[str, str]) -> tuple[int, float]:
                started = time.perf_counter()
                connection.request("GET", "/v1/whoami", headers=headers)
                response = connection.getresponse()
                response.read()
                return response.status, 1e6 * (time.perf_counter() - started)

            if status(_basic(admin.key_id, admin.secret))[0] != 200:
                raise SystemExit("auth_timing: the admin key was refused")
            taken: dict[str, list[float]] = {kind: [] for kind in KINDS}
            for number in range(requests):
                for kind in KINDS if number % 2 else reversed(KINDS):
                    key_id = new_key_id() if kind == KINDS[0] else admin.key_id
                    code, micros = status(_basic(key_id, new_secret()))
                    if code != 401:
                        raise SystemExit(f"auth_timing: {kind} answered {code}, not 401")
                    taken[kind].append(micros)
            connection.close()
    return taken


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=1500, help="of each kind (1500)")
    taken = measure(parser.parse_args().requests)
    for kind, micros in taken.items():
        tenth = sorted(micros)[len(micros) // 10]
        print(f"{kind:26s} median {statistics.median(micros):7.1f} µs, p10 {tenth:7.1f} µs")


if __name__ == "__main__":
    main()
