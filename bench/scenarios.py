"""The benchmark's scenarios: the requests each sends, and probing keysvc with them.

Each scenario becomes a file of requests for bench/rotate.lua, one per line
(``METHOD<TAB>PATH<TAB>AUTHORIZATION<TAB>BODY``). Scenarios that authenticate
as "each key" rotate through the seeded sample, so consecutive requests carry
different credentials; create uses the organization's admin key, and so does
"get-other", reading in turn the keys seeded never to authenticate, which
keysvc therefore never finds in memory. A paced scenario is driven by hey at a
fixed rate instead of by wrk flat out (bench/hey.py), with its first request.

Each scenario calls one of the baseline's routes (bench/baseline.py), and the
baseline answers a route as keysvc answered the first scenario of that name.
"""

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from bench.baseline import Shape
from bench.seed import Credential, Seeded

CREATE_BODY = json.dumps({"name": "bench", "roles": ["developer"]})
# Headers the baseline must not replay: aiohttp sets them itself, or makes them fresh.
_OWN_HEADERS = frozenset(
    {"date", "server", "content-length", "x-request-id", "transfer-encoding", "connection"}
)


@dataclass(frozen=True)
class Line:
    method: str
    path: str
    authorization: str
    body: str = ""

    def tsv(self) -> str:
        return f"{self.method}\t{self.path}\t{self.authorization}\t{self.body}\n"


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    lines: Callable[[Seeded], list[Line]]
    route: str = ""  # the baseline's route it calls (bench.baseline.ROUTES); "": its name
    paced: bool = False  # hey at half B's peak of ``route``, p99 compared; else wrk flat out

    @property
    def calls(self) -> str:
        return self.route or self.name


def basic(cred: Credential) -> str:
    return "Basic " + base64.b64encode(f"{cred.key_id}:{cred.secret}".encode()).decode()


def _keys(seeded: Seeded) -> str:
    return f"/v1/organizations/{seeded.organization_id}/keys"


def _verifying(name: str, title: str, keys: Callable[[Seeded], list[Credential]]) -> Scenario:
    """A verify scenario rotating through ``keys`` of the seeded ones, answered as verify."""
    return Scenario(
        name,
        title,
        lambda s: [Line("GET", "/v1/verify", basic(c)) for c in keys(s)],
        route="verify",
    )


SCENARIOS = (
    Scenario(
        "get",
        "GET a key, each key reading itself",
        lambda s: [Line("GET", f"{_keys(s)}/{c.id}", basic(c)) for c in s.sample],
    ),
    Scenario(
        "get-other",
        "GET a key as the admin key, rotating keys it is not (never in memory)",
        lambda s: [Line("GET", f"{_keys(s)}/{uuid}", basic(s.admin)) for uuid in s.others],
        route="get",
    ),
    Scenario(
        "verify",
        "GET /v1/verify, rotating keys",
        lambda s: [Line("GET", "/v1/verify", basic(c)) for c in s.sample],
    ),
    Scenario(
        "verify-paced",
        "GET /v1/verify at a fixed {rate} req/s, half B's verify peak (hey); B/A of p99",
        lambda s: [Line("GET", "/v1/verify", basic(c)) for c in s.sample[:1]],
        route="verify",
        paced=True,
    ),
    _verifying(
        "verify-credits",
        "GET /v1/verify spending 1 credit, rotating keys with credits (issue 29)",
        lambda s: s.credited,
    ),
    _verifying(
        "verify-limited",
        "GET /v1/verify counting one autoApply named limit, rotating such keys (issue 36)",
        lambda s: s.limited,
    ),
    _verifying(
        "verify-identity",
        "GET /v1/verify spending 1 credit of the key's identity, rotating keys of identities"
        " of 4 keys (issue 36)",
        lambda s: s.identified,
    ),
    _verifying(
        "verify-identity-both",
        "GET /v1/verify spending 1 credit of the key's and 1 of its identity's, rotating"
        " such keys (issue 36)",
        lambda s: s.both,
    ),
    Scenario(
        "list",
        "GET the first page of 100 keys, rotating keys",
        lambda s: [Line("GET", f"{_keys(s)}?limit=100", basic(c)) for c in s.sample],
    ),
    Scenario(
        "create",
        "POST a key as the admin key",
        lambda s: [Line("POST", _keys(s), basic(s.admin), CREATE_BODY)],
    ),
)
BY_NAME = {scenario.name: scenario for scenario in SCENARIOS}


def write_requests(scenario: Scenario, seeded: Seeded, path: Path) -> Path:
    path.write_text("".join(line.tsv() for line in scenario.lines(seeded)))
    return path


def probe(base: str, line: Line) -> Shape:
    """Send one request with urllib; the answer, whatever its status."""
    request = urllib.request.Request(  # noqa: S310 - a loopback URL of our own
        base + line.path,
        method=line.method,
        data=line.body.encode() if line.body else None,
        headers={"Authorization": line.authorization, "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310
            status, headers, body = answer.status, answer.headers, answer.read()
    except urllib.error.HTTPError as error:
        status, headers, body = error.code, error.headers, error.read()
    kept = {name: value for name, value in headers.items() if name.lower() not in _OWN_HEADERS}
    return Shape(status, kept, body)


def baseline_shape(scenario: Scenario, seeded: Seeded, answer: Shape) -> Shape:
    """What the baseline answers for ``scenario``: keysvc's answer, always as a 200.

    If keysvc cannot answer verify yet, the baseline still answers verify's contract:
    an empty 200 carrying the key's identity and permissions.
    """
    if scenario.name == "verify" and not 200 <= answer.status < 300:
        cred = seeded.sample[0]
        headers = {
            "X-Key-Id": cred.id,
            "X-Organization-Id": seeded.organization_id,
            "X-Key-Permissions": "keys:read,roles:read",
        }
        return Shape(200, headers, b"")
    return Shape(200, answer.headers, answer.body)


def touch(base: str, seeded: Seeded, most: int = 1000) -> None:
    """Use each key of every scenario once (the first ``most`` of a larger sample), so
    that each has the ``usedAt`` it will show from now on: a key's first use in a minute
    waits for its usedAt write, and a scenario whose keys had not been used would pay
    those writes in its first round where the sample's did not. Sixteen at a time, so
    that the writes share transactions; a big sample is left to the warm-up."""
    creds = [seeded.admin, *seeded.sample[:most], *seeded.credited, *seeded.limited]
    creds += [*seeded.identified, *seeded.both]
    lines = [Line("GET", f"{_keys(seeded)}/{cred.id}", basic(cred)) for cred in creds]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(partial(probe, base), lines))


def capture(base: str, scenario: Scenario, seeded: Seeded) -> Shape:
    """keysvc's answer to the scenario's first request, once every key has been used."""
    return probe(base, scenario.lines(seeded)[0])


def capture_shapes(base: str, seeded: Seeded, shapes_file: Path) -> Path:
    """Every key used once, then each scenario's baseline answer (``baseline_shape``)
    from keysvc at ``base``, written to ``shapes_file`` for the replaying apps."""
    touch(base, seeded)
    shapes = {
        s.name: baseline_shape(s, seeded, capture(base, s, seeded))
        for s in SCENARIOS
        if s.calls == s.name
    }
    shapes_file.write_text(json.dumps({name: shape.as_json() for name, shape in shapes.items()}))
    return shapes_file
